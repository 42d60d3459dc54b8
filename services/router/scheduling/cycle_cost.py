"""The scheduler's cost model (design.md section 5): expected cost and emitted tokens of one cycle.

For a candidate (chain, window) and a batch, one cycle is predicted exactly under the model's inputs by
carrying the distribution of proposal lengths up the chain:

- level 1 (the drafter) makes W forward passes: the first feeds its pending tokens, the others one token;
- level j verifies what level j - 1 handed up. A row whose incoming proposal has l tokens accepts m of
  them with probability a_0 ... a_(m-1) (1 - a_m) (all l with probability a_0 ... a_(l-1)), where a_i
  is the pair's acceptance at draft position i, and hands up m + 1 tokens. Its forward feeds 1 pending
  token plus the proposal, and the batch is padded to its longest row, so the pass costs
  t_j(B, 1 + max_b l_b); rows are independent, so P(max <= l) = prod_b P(l_b <= l);
- the target's hand-up is what the cycle emits.

T_eff = E[cost] / E[emitted]: the expected wall time per emitted token of a row. Every cycle also costs
the router's own work and one round trip per level, measured live and added here.

Approximations, each small and stated: the drafter's first pass feeds 1 + max(0, emitted - W) tokens
(the tokens emitted last cycle that it has not cached, assuming last cycle ran the same chain); an
intermediate verifier feeds 1 pending token; acceptance at a position does not depend on the others'
outcomes beyond the prefix rule (positions are measured as conditional rates, so this is exact for the
mean of each position but ignores correlation between rows of one batch).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

LatencyFn = Callable[[str, int, int], float]          # (model, batch size, tokens per row) -> ns
OverheadFn = Callable[[str, int], float]              # (model, forward passes in the call) -> ns


@dataclass(frozen=True)
class RowGroup:
    """Rows of one decoding mode in the batch, and their acceptance per level pair of the chain."""

    rows: int
    acceptance: Sequence[Sequence[float]]   # per verifier level j = 2..n: a_i for i = 0..max proposal - 1


@dataclass(frozen=True)
class Prediction:
    chain: tuple[str, ...]
    window: int
    batch_size: int
    cost_ns: float                 # expected wall time of one cycle
    emitted: float                 # expected tokens emitted per row
    level_ns: tuple[float, ...]    # expected wall time per level, router overhead excluded
    checks: tuple[tuple[float, float], ...] = ()  # per verifier level: (E[accepted], E[positions checked]) per row
    emitted_var: float = 0.0       # variance of the tokens one row emits in a cycle
    emitted_dist: tuple[float, ...] = ()   # P(a row emits n tokens in a cycle), n = 0, 1, ... (rows mixed)

    @property
    def t_eff_ns(self) -> float:
        return self.cost_ns / self.emitted

    @property
    def tokens_per_s(self) -> float:
        return self.batch_size * self.emitted / self.cost_ns * 1e9

    def scaled_cost_ns(self, scales: Mapping[str, float]) -> float:
        """The cycle's cost with each level's time multiplied by its model's scale (1 when not given)."""
        return self.cost_ns + sum(ns * (scales.get(m, 1.0) - 1.0) for ns, m in zip(self.level_ns, self.chain))

    def scaled(self, scales: Mapping[str, float]) -> Prediction:
        """The same cycle with each level's time multiplied by its model's scale."""
        level_ns = tuple(ns * scales.get(m, 1.0) for ns, m in zip(self.level_ns, self.chain))
        return dataclasses.replace(self, cost_ns=self.scaled_cost_ns(scales), level_ns=level_ns)


def accepted_distribution(incoming: Sequence[float], rates: Sequence[float]) -> tuple[list[float], float]:
    """Distribution of the hand-up length (accepted + 1) given the distribution of incoming lengths.

    incoming[l] = P(proposal has l tokens); out[m + 1] = P(m accepted). rates[i] is the acceptance at
    position i given all earlier positions were accepted. Also returns the expected number of positions
    checked (up to and including the first rejection), the denominator of a measured acceptance rate.
    """
    out = [0.0] * (len(incoming) + 1)
    tried = 0.0
    for length, p_len in enumerate(incoming):
        if p_len == 0.0:
            continue
        reach = p_len                      # P(first `m` positions accepted)
        for m in range(length):
            a = rates[m] if m < len(rates) else rates[-1]
            tried += reach
            out[m + 1] += reach * (1.0 - a)
            reach *= a
        out[length + 1] += reach
    return out, tried


def _cdf(dist: Sequence[float]) -> list[float]:
    total, out = 0.0, []
    for p in dist:
        total += p
        out.append(min(total, 1.0))
    return out


def expected_batch_cost(dists: Sequence[tuple[Sequence[float], int]], cost: Callable[[int], float]) -> float:
    """E[cost(max over rows of the length)]: `dists` holds (length distribution, rows) per row group."""
    cdfs = [(_cdf(d), n) for d, n in dists if n > 0]
    longest = max(len(c) for c, _ in cdfs)
    expected, below = 0.0, 0.0
    for length in range(longest):
        at_most = 1.0
        for c, n in cdfs:
            at_most *= (c[length] if length < len(c) else 1.0) ** n
        p = at_most - below
        if p > 1e-12:
            expected += p * cost(length)
        below = at_most
    return expected


def predict(chain: Sequence[str], window: int, groups: Sequence[RowGroup], latency: LatencyFn,
            overhead: OverheadFn, cycle_overhead_ns: float = 0.0) -> Prediction:
    """Expected cost and emitted tokens of one cycle of `chain` at `window` over the rows of `groups`."""
    chain = tuple(chain)
    batch = sum(g.rows for g in groups)
    if batch < 1:
        raise ValueError("a prediction needs at least one row")
    if len(chain) == 1:
        (model,) = chain
        level_ns = (latency(model, batch, 1) + overhead(model, 1),)
        return Prediction(chain, 0, batch, level_ns[0] + cycle_overhead_ns, 1.0, level_ns, emitted_dist=(0.0, 1.0))
    # lengths per group, level by level: level 1 proposes exactly W tokens
    incoming = [[0.0] * window + [1.0] for _ in groups]
    verify_ns, checks = [], []
    for level, model in enumerate(chain[1:]):
        verify_ns.append(expected_batch_cost([(d, g.rows) for d, g in zip(incoming, groups)],
                                             lambda length, m=model: latency(m, batch, 1 + length))
                         + overhead(model, 1))
        steps = [accepted_distribution(d, g.acceptance[level]) for d, g in zip(incoming, groups)]
        incoming = [out for out, _ in steps]
        accepted = sum(g.rows * sum((n - 1) * p for n, p in enumerate(out) if n) for (out, _), g in zip(steps, groups))
        tried = sum(g.rows * t for (_, t), g in zip(steps, groups))
        checks.append((accepted / batch, tried / batch))
    emitted_dists = incoming
    drafter = chain[0]
    # the drafter's first pass feeds the emitted tokens it has not cached: it cached W - 1 of its own
    first_dists = []
    for d in emitted_dists:
        pending = [0.0] * (len(d) + 1)
        for n, p in enumerate(d):
            pending[1 + max(0, n - window)] += p
        first_dists.append(pending)
    draft_ns = (expected_batch_cost([(d, g.rows) for d, g in zip(first_dists, groups)],
                                    lambda k: latency(drafter, batch, k))
                + (window - 1) * latency(drafter, batch, 1) + overhead(drafter, window))
    emitted = sum(g.rows * sum(n * p for n, p in enumerate(d)) for d, g in zip(emitted_dists, groups)) / batch
    square = sum(g.rows * sum(n * n * p for n, p in enumerate(d)) for d, g in zip(emitted_dists, groups)) / batch
    mixed = [0.0] * max(len(d) for d in emitted_dists)
    for d, g in zip(emitted_dists, groups):
        for n, p in enumerate(d):
            mixed[n] += g.rows * p / batch
    level_ns = (draft_ns, *verify_ns)
    return Prediction(chain, window, batch, sum(level_ns) + cycle_overhead_ns, emitted, level_ns, tuple(checks),
                      max(0.0, square - emitted * emitted), tuple(mixed))


def _emitted_matrix(predictions: Sequence[Prediction]) -> np.ndarray:
    """P(a row emits n tokens in a cycle), one row per candidate, n = 0 .. the most any emits."""
    width = max(len(p.emitted_dist) for p in predictions)
    out = np.zeros((len(predictions), width))
    for c, p in enumerate(predictions):
        out[c, :len(p.emitted_dist)] = p.emitted_dist
    return out


def best_finish(predictions: Sequence[Prediction], costs: Sequence[float], horizon: int) -> list[float]:
    """V(r), r = 0 .. `horizon`: one row's least expected cost to emit r more tokens, cycle by cycle, by
    dynamic programming over the candidates (of cost `costs[c]`, emitting `emitted_dist`) whose window
    fits the tokens left (window < r; the target alone always fits): V(r) = min_c cost_c + E V(r - X_c),
    the tokens a cycle emits past r dropped."""
    emitted = _emitted_matrix(predictions)
    cost = np.asarray(costs, dtype=float)
    window = np.array([0 if len(p.chain) == 1 else p.window for p in predictions])
    best = np.zeros(horizon + 1)
    for r in range(1, horizon + 1):
        n = min(r, emitted.shape[1])
        value = cost + emitted[:, 1:n] @ best[r - 1:r - n:-1]   # sum over 0 < n < r of P(n) V(r - n)
        fits = window < r
        best[r] = value[fits].min() if fits.any() else value.min()
    return best.tolist()


def _extended(best: Sequence[float], rate: float, reach: int) -> np.ndarray:
    """V(0 .. reach): `best` up to its horizon, then `rate` per token more (far from the end every token
    costs the least T_eff)."""
    horizon = len(best) - 1
    k = np.arange(reach + 1)
    return np.where(k <= horizon, np.asarray(best)[np.minimum(k, horizon)], best[horizon] + (k - horizon) * rate)


def finish_regret(prediction: Prediction, cost: float, best: Sequence[float], rate: float, left: int) -> float:
    """What one cycle of `prediction` (of cost `cost`) costs a row with `left` tokens to emit beyond the
    best finish (`best`: best_finish's V, extended past its horizon at `rate`, the least T_eff). Far from
    the end it is cost - rate E[X], T_eff's excess over the best times the tokens emitted; near it, it
    counts the tokens emitted past the end and what the remaining few cost to finish."""
    return cost + float(finish_excess([prediction], best, rate, left)[0, left])


def finish_excess(predictions: Sequence[Prediction], best: Sequence[float], rate: float, reach: int) -> np.ndarray:
    """finish_regret less the cycle's own cost, for every candidate (rows) and tokens left 0 .. `reach`
    (columns; 0 at 0 left): E V(r - X) - V(r), V extended past its horizon at `rate`."""
    emitted = _emitted_matrix(predictions)
    value = _extended(best, rate, reach + emitted.shape[1])
    r = np.arange(reach + 1)[None, :]
    n = np.arange(emitted.shape[1])[:, None]
    after = np.where((n > 0) & (n < r), value[np.maximum(r - n, 0)], 0.0)   # V(r - n) for 0 < n < r
    out = emitted @ after - value[None, :reach + 1]
    out[:, 0] = 0.0
    return out


@functools.cache
def max_normal_moments(n: int) -> tuple[float, float]:
    """Mean and standard deviation of the largest of n independent standard normals (0, 1 for one), by
    integrating the density n phi(x) Phi(x)^(n - 1) over [-8, 8]."""
    if n <= 1:
        return 0.0, 1.0
    step, first, second = 0.01, 0.0, 0.0
    for i in range(-800, 800):   # midpoints of [-8, 8]
        x = (i + 0.5) * step
        cdf = 0.5 * math.erfc(-x / math.sqrt(2))
        density = n * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * cdf ** (n - 1)
        first += x * density * step
        second += x * x * density * step
    return first, math.sqrt(max(0.0, second - first * first))


_SQRT2 = math.sqrt(2.0)
_SQRT2PI = math.sqrt(2.0 * math.pi)


def expected_max(groups: Sequence[tuple[float, float, int]]) -> float:
    """E[max] of independent normals given as (mean, sd, how many alike): each group of n alike is the
    largest of n (max_normal_moments), and groups combine by Clark's moment matching (Clark 1961: the max
    of two normals taken as a normal of the same first two moments), largest mean first. A group whose
    mean lies more than 8 combined sds below the running max is left out (it moves E[max] by < 1e-15)."""
    parts = []
    for mean, sd, n in groups:
        shift, spread = max_normal_moments(n)
        parts.append((mean + sd * shift, sd * spread if n > 1 else sd))
    parts.sort(key=lambda ms: -ms[0])
    m1, s1 = parts[0]
    for m2, s2 in parts[1:]:
        theta = math.sqrt(s1 * s1 + s2 * s2)
        if theta <= 0.0 or (m1 - m2) / theta > 8.0:
            m1 = max(m1, m2)
            continue
        alpha = (m1 - m2) / theta
        up, down = 0.5 * math.erfc(-alpha / _SQRT2), 0.5 * math.erfc(alpha / _SQRT2)
        pdf = math.exp(-0.5 * alpha * alpha) / _SQRT2PI
        first = m1 * up + m2 * down + theta * pdf
        second = (m1 * m1 + s1 * s1) * up + (m2 * m2 + s2 * s2) * down + (m1 + m2) * theta * pdf
        m1, s1 = first, math.sqrt(max(0.0, second - first * first))
    return m1


def tail_factor(prediction: Prediction, solo_cost_ns: float, tokens_left: float | Sequence[float],
                cost_ns: float | None = None) -> float:
    """What running `prediction`'s configuration until the rows finish costs per token, over its T_eff.

    T_eff counts a cycle's tokens as if every one were wanted and every row stayed to the end. Two things
    it leaves out grow with the window:

    - the last cycle of a row overshoots: it emits past the tokens the row had left and those are
      dropped. With X the tokens a cycle emits (mean mu, variance sigma^2), a row with r tokens left needs
      E[K] = (r + (E[X^2] - mu) / (2 mu)) / mu cycles (renewal theory; within 1% of simulation for r of
      8 to 48 and windows 2 to 8);
    - the rows finish apart: K is about normal with standard deviation sigma sqrt(r) / mu^1.5, and while
      the last rows run the batch is small. A cycle's cost splits into a part that does not shrink with
      the rows (a, from the one-row cycle: cost(1) = a + b, cost(B) = a + B b) and a part per row, so the
      batch's time is about a E[max_b K_b] + b sum_b E[K_b].

    `tokens_left`: per row of the batch (rows of a wave that accepted differently have different amounts
    left, and the batch waits for the one furthest behind: E[max] is over their own K_b, expected_max),
    or one mean for every row. With r tokens left in every row this is T_eff times (r + overshoot) / r +
    (a / cost(B)) e_B sigma / sqrt(r mu), e_B the expected maximum of B standard normals. `cost_ns`: the
    cycle's cost when it is not the prediction's own (scaled to what the batch's passes measure).
    """
    batch, cost = prediction.batch_size, prediction.cost_ns if cost_ns is None else cost_ns
    left = [float(tokens_left)] * batch if isinstance(tokens_left, (int, float)) else [float(r) for r in tokens_left]
    left = [r for r in left if r > 0]
    if not left:
        return 1.0
    mu, var = prediction.emitted, prediction.emitted_var
    overshoot = (var + mu * mu - mu) / (2 * mu)
    alike: dict[float, int] = {}
    for r in left:
        alike[r] = alike.get(r, 0) + 1
    means = {r: (r + overshoot) / mu for r in alike}
    mean_left = sum(left) / len(left)
    if batch > 1:
        fixed = min(cost, max(0.0, (batch * solo_cost_ns - cost) / (batch - 1)))
    else:
        fixed = cost
    per_row = (cost - fixed) / batch
    longest = expected_max([(means[r], math.sqrt(var * r / mu ** 3), n) for r, n in alike.items()])
    time = fixed * longest + per_row * sum(means[r] * n for r, n in alike.items())
    # time per token delivered (the rows' tokens left) over T_eff per token of the batch, cost / (batch mu)
    return time * mu / (cost * mean_left) * batch / len(left)


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
    averaged different prompts (a long context costs more) ranked window 3 cheaper than window 2 at
    batch 16 (the target's 4-token pass 81 ms against 94 for 3 tokens). A batch size without points is
    interpolated between the nearest measured ones (extrapolated along the last segment, never below the
    nearest).
    """

    def __init__(self, points: Mapping[str, Mapping[tuple[int, int], tuple[float, float]]]):
        self._by_batch: dict[str, dict[int, tuple[tuple[float, float], dict[int, tuple[float, float]]]]] = {}
        for model, pts in points.items():
            rows: dict[int, dict[int, tuple[float, float]]] = {}
            for (b, k), (ns, w) in pts.items():
                rows.setdefault(b, {})[k] = (ns, w)
            self._by_batch[model] = {b: _monotone(_fit_line([(k, ns, w) for k, (ns, w) in r.items()
                                                             if k > 1 or len(r) == 1]), r)
                                     for b, r in rows.items()}
        self._cache: dict[tuple[str, int, int], float] = {}

    def models(self) -> set[str]:
        return set(self._by_batch)

    def __call__(self, model: str, batch_size: int, tokens: int) -> float:
        key = (model, batch_size, tokens)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._lookup(model, batch_size, tokens)
        return hit

    def _lookup(self, model: str, batch_size: int, tokens: int) -> float:
        from specrouter.profiler.metrics import bucket

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
