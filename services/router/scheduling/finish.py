"""A row's finish: what the last cycles of a row, and of a batch whose rows finish apart, cost beyond T_eff.

T_eff (cycle_cost) counts a cycle's tokens as if every one were wanted and every row stayed to the end.
Near a row's end neither holds: a cycle emits past the tokens the row has left (they are dropped), and a
batch's rows finish apart, so that while the last ones run the batch is small and its cycles cost nearly
as much as full ones. One row is costed exactly, by dynamic programming over the candidates' emitted
distributions (`best_finish`, `finish_excess`, tabled once per one-row plan as `Finish`); a batch by a
factor over T_eff from renewal theory and the expected maximum of the rows' cycle counts (`tail_factor`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specrouter.router.scheduling.cycle_cost import Prediction

FINISH_HORIZON = 16   # tokens left up to which a one-row batch's finish is costed exactly


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


@dataclass(frozen=True)
class Finish:
    """A one-row plan's finish costs at the latency table's own times: the least T_eff (`rate`) and, per
    candidate (by id), finish_regret less the cycle's cost for every number of tokens left up to `reach`."""

    rate: float
    excess: dict[int, list[float]]

    @classmethod
    def of(cls, predictions: Sequence[Prediction], horizon: int, reach: int) -> Finish:
        rate = min(p.t_eff_ns for p in predictions)
        best = best_finish(predictions, [p.cost_ns for p in predictions], horizon)
        table = finish_excess(predictions, best, rate, reach).tolist()
        return cls(rate, {id(p): row for p, row in zip(predictions, table)})
