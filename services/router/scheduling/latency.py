"""Latency fitting: each model's forward time t_model(B, k) for B rows of k tokens, from the profiler's live
figures and the workers' warm-up profile.

`latency_table` merges the two (live points weighted by the passes they average, warm-up points scaled
to what live passes cost, `warmup_scales`) into a `LatencyTable`, which fits a line per batch size and
keeps the values nondecreasing in k.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from specrouter.contract.measures import bucket
from specrouter.router.scheduling.snapshot import Snapshot


LINE_WEIGHT = 8.0   # passes the line counts for against a measured point's own value (EMAs are noisy)


class LatencyTable:
    """t_model(B, k) from measured points: per batch size, a weighted least-squares line in k >= 2, and
    the measured point where there is one, shrunk towards the line by LINE_WEIGHT passes.

    Points are (batch bucket, tokens bucket) -> (ns, weight) per model; the weight is how many passes the
    point averages (capped by the caller). The line pools every window's measurements, so a window that
    has not run lately is not judged on one stale point (a warm-up point, one pass, counts a ninth), and
    the noise of one point's EMA is damped. A single-token pass is its own regime (a decode step: on a
    CPU it costs two thirds of a two-token pass, far below the line through longer ones), so k = 1 takes
    its measured point as it is and stays out of the line (unless it is the only point). With a single
    point the line is flat in k. A pass over more tokens never costs less: the values at the measured k
    are made nondecreasing in k by a weighted isotonic fit (pool adjacent violators; a point's weight is
    its passes plus the line's), and a k between them stays between their values. Without it, EMAs that
    averaged different prompts (a long context costs more) can rank a window cheaper than a shorter
    one. A batch size without points is interpolated between the nearest measured ones (extrapolated
    along the last segment, never below the nearest).
    """

    def __init__(self, points: Mapping[str, Mapping[tuple[int, int], tuple[float, float]]],
                 free: Sequence[str] = ()):
        """`free`: levels that run no forward pass (the lookup), whose passes cost 0 here (what their calls
        cost is the router's measured call overhead)."""
        self.free = frozenset(free)
        self._by_batch: dict[str, dict[int, tuple[tuple[float, float], dict[int, tuple[float, float]]]]] = {}
        for model, pts in points.items():
            rows: dict[int, dict[int, tuple[float, float]]] = {}
            for (b, k), (ns, w) in pts.items():
                rows.setdefault(b, {})[k] = (ns, w)
            self._by_batch[model] = {b: _monotone(_fit_line([(k, ns, w) for k, (ns, w) in r.items()
                                                             if k > 1 or len(r) == 1]), r)
                                     for b, r in rows.items()}
        self._cache: dict[tuple[str, int, int], float] = {}
        self._costs: dict[tuple[str, int, int], np.ndarray] = {}

    def models(self) -> set[str]:
        return set(self._by_batch) | self.free

    def line(self, model: str, batch_bucket: int) -> tuple[float, float]:
        """(intercept, slope) in k of the line fitted for the model at a measured batch bucket."""
        return self._by_batch[model][batch_bucket][0]

    def __call__(self, model: str, batch_size: int, tokens: int) -> float:
        key = (model, batch_size, tokens)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._lookup(model, batch_size, tokens)
        return hit

    def costs(self, model: str, batch_size: int, longest: int) -> np.ndarray:
        """This table at tokens 1 .. `longest` for one model and batch size, as a read-only array (a plan's
        chains through a model price the same passes)."""
        key = (model, batch_size, longest)
        hit = self._costs.get(key)
        if hit is None:
            hit = self._costs[key] = np.array([self(model, batch_size, k) for k in range(1, longest + 1)])
            hit.flags.writeable = False
        return hit

    def _lookup(self, model: str, batch_size: int, tokens: int) -> float:
        if model in self.free:
            return 0.0
        by_batch = self._by_batch.get(model)
        if not by_batch:
            raise KeyError(f"no latency measured for model {model!r}")
        b, k = bucket(batch_size), bucket(tokens)
        if b in by_batch:
            return _at(*by_batch[b], k)
        sizes = sorted(by_batch)
        return _interpolate(sizes, [_at(*by_batch[s], k) for s in sizes], b)


def _at(line: tuple[float, float], fitted: Mapping[int, float], k: int) -> float:
    """The isotonic value at a measured k; elsewhere the line, kept between the neighbouring values."""
    if k in fitted:
        return fitted[k]
    on_line = max(line[0] + line[1] * k, 0.0)
    below = [v for j, v in fitted.items() if j < k]
    above = [v for j, v in fitted.items() if j > k]
    if above:
        on_line = min(on_line, min(above))
    if below:
        on_line = max(on_line, max(below))
    return on_line


def _shrunk(line: tuple[float, float], points: Mapping[int, tuple[float, float]], k: int) -> tuple[float, float]:
    """A measured point shrunk towards the line (k = 1 as measured), and the weight behind it."""
    ns, w = points[k]
    if k == 1:
        return ns, w
    on_line = max(line[0] + line[1] * k, 0.0)
    return (w * ns + LINE_WEIGHT * on_line) / (w + LINE_WEIGHT), w + LINE_WEIGHT


def _monotone(line: tuple[float, float], points: Mapping[int, tuple[float, float]],
              ) -> tuple[tuple[float, float], dict[int, float]]:
    """(line, nondecreasing values at the measured k): the weighted isotonic fit of the shrunk points."""
    blocks: list[list[float]] = []   # [value, weight, points pooled]
    ks = sorted(points)
    for k in ks:
        value, weight = _shrunk(line, points, k)
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (v2, w2, n2), (v1, w1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    values = [v for v, _, n in blocks for _ in range(n)]
    return line, dict(zip(ks, values))


def _fit_line(points: Sequence[tuple[int, float, float]]) -> tuple[float, float]:
    """(intercept, slope) of ns against k, weighted least squares; the slope is never negative."""
    w = sum(p[2] for p in points)
    mk = sum(k * wt for k, _, wt in points) / w
    my = sum(y * wt for _, y, wt in points) / w
    skk = sum(wt * (k - mk) ** 2 for k, _, wt in points)
    if skk <= 0:
        return my, 0.0
    slope = max(0.0, sum(wt * (k - mk) * (y - my) for k, y, wt in points) / skk)
    return my - slope * mk, slope


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: int) -> float:
    if len(xs) == 1:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    lo = min(max(i - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[lo], xs[lo + 1], ys[lo], ys[lo + 1]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    nearest = ys[0] if x < xs[0] else ys[-1] if x > xs[-1] else None
    if nearest is not None:  # extrapolating: cost grows with size, and never drops below the nearest point
        y = max(y, nearest) if x > xs[-1] else min(y, nearest)
    return max(y, 0.0)


LATENCY_WEIGHT_CAP = 32   # passes beyond which a measured point weighs no more in its line


def latency_table(snapshot: Snapshot | None, warmup: Mapping[str, Sequence[tuple[int, int, int]]],
                  free: Sequence[str] = ()) -> LatencyTable:
    """Live latencies from the snapshot, weighted by the passes each averages; the workers' warm-up
    profile (one pass per point) fills what the snapshot lacks, scaled per model and batch size by
    `warmup_scales`. `free`: the levels that run no model (LatencyTable)."""
    live: dict[str, dict[tuple[int, int], tuple[float, float]]] = {}
    if snapshot is not None:
        for f in snapshot.forward:
            live.setdefault(f.model, {})[(f.batch_size_bucket, f.tokens_per_row_bucket)] = \
                (f.ema_forward_ns, float(min(max(f.samples, 1), LATENCY_WEIGHT_CAP)))
    warm = {model: {(bucket(b), bucket(k)): float(ns) for b, k, ns in timings} for model, timings in warmup.items()}
    scales = warmup_scales(warm, live)
    points: dict[str, dict[tuple[int, int], tuple[float, float]]] = {}
    for model, timings in warm.items():
        points[model] = {(b, k): (ns * scales[model](b), 1.0) for (b, k), ns in timings.items()}
    for model, measured in live.items():
        points.setdefault(model, {}).update(measured)
    return LatencyTable(points, free)


def warmup_scales(warm: Mapping[str, Mapping[tuple[int, int], float]],
                  live: Mapping[str, Mapping[tuple[int, int], tuple[float, float]]],
                  ) -> dict[str, Callable[[int], float]]:
    """Per model, batch size -> how much slower it runs live than at warm-up.

    A worker times its warm-up alone on the machine; live passes share it with the rest of the cluster,
    and how much slower they run depends on the model and grows with the batch. A point known only from
    warm-up would make what has not run lately look cheap, and a configuration picked for that runs far
    slower than predicted. So, on the log scale, with the weighted geometric mean of live / warm-up over
    the points measured both ways: a model's own figure at a batch size where it has one; else its own
    over every batch size plus how much more the other models measured at that batch size run slow
    there than overall; a model never measured live takes the other models' figure at that batch size
    (or over every batch size). With nothing measured, 1.
    """
    ratios = {model: _log_ratios(w, live.get(model, {})) for model, w in warm.items()}
    own = {m: _mean(list(r.values())) for m, r in ratios.items() if r}
    by_batch: dict[str, dict[int, float]] = {}
    for model, r in ratios.items():
        per: dict[int, list[tuple[float, float]]] = {}
        for (b, _), xw in r.items():
            per.setdefault(b, []).append(xw)
        by_batch[model] = {b: _mean(xs) for b, xs in per.items()}

    def pooled(b: int | None, exclude: str) -> tuple[float | None, float | None]:
        """(mean over other models of their figure at b, of that figure less their own overall)."""
        level, offset = [], []
        for m, per in by_batch.items():
            if m != exclude and m in own and (b is None or b in per):
                value = own[m] if b is None else per[b]
                level.append((value, 1.0))
                offset.append((value - own[m], 1.0))
        return (_mean(level), _mean(offset)) if level else (None, None)

    def scale_for(model: str) -> Callable[[int], float]:
        @functools.cache
        def scale(b: int) -> float:
            if b in by_batch.get(model, {}):
                return math.exp(by_batch[model][b])
            level, offset = pooled(b, model)
            if model in own:
                return math.exp(own[model] + (offset or 0.0))
            if level is None:
                level, _ = pooled(None, model)
            return math.exp(level) if level is not None else 1.0
        return scale
    return {model: scale_for(model) for model in warm}


def _log_ratios(warm: Mapping[tuple[int, int], float], live: Mapping[tuple[int, int], tuple[float, float]],
                ) -> dict[tuple[int, int], tuple[float, float]]:
    """(log(live / warm-up), passes) at each point measured both ways."""
    return {key: (math.log(ns / warm[key]), w) for key, (ns, w) in live.items()
            if key in warm and warm[key] > 0 and ns > 0}


def _mean(points: Sequence[tuple[float, float]]) -> float:
    return math.fsum(x * w for x, w in points) / math.fsum(w for _, w in points)
