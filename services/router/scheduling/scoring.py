"""Scores of the candidates: what the decision policy ranks them by.

The plain score is T_eff, each level scaled by its model's latency scale at the batch's context length.
On top of it, the tail (weighted by `tail_weight`): a row's last cycle emits past its tokens left
(dropped), and a batch's rows finish apart, so that while the last ones run the batch is small and its
cycles cost nearly as much as full ones. Long windows emit more per cycle but more unevenly, so they
overshoot more and their rows spread out more; a batch's candidates are scored by T_eff times the
expected cost of both (finish.tail_factor), from each row's tokens left (the batch waits for the row
furthest behind) and the cost of the same cycle for one row. That factor is never below 1, so the
candidates are taken in order of T_eff and scored only until the next one's T_eff reaches the best score
found (`least`). A batch of one row is costed exactly instead: a candidate scores the best T_eff plus its
regret against the row's best finish per token it emits (`finish_score`).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping, Sequence

from specrouter.router.row import Row
from specrouter.router.scheduling.cycle_cost import Prediction
from specrouter.router.scheduling.finish import FINISH_HORIZON, Finish, tail_factor
from specrouter.router.scheduling.plans import Plan

Score = Callable[[Prediction], float]
NO_SCALES: Mapping[str, float] = types.MappingProxyType({})   # every model as the latency table says


def t_eff(p: Prediction) -> float:
    return p.t_eff_ns


def least(candidates: Sequence[Prediction], score: Score, scales: Mapping[str, float]) -> Prediction | None:
    """The candidate of least `score`, from candidates ordered by scaled T_eff, which `score` never goes
    below unless it says so (`bounded` False): once the next one's T_eff is no less than the best score
    found, none after it can beat it."""
    best, best_score = None, math.inf
    bounded = getattr(score, "bounded", True)
    for p in candidates:
        if best is not None and bounded and (score is t_eff or p.scaled_cost_ns(scales) / p.emitted >= best_score):
            break
        value = score(p)
        if value < best_score:
            best, best_score = p, value
    return best


def row_tokens_left(row: Row) -> int:
    return row.max_new_tokens - (len(row.tokens) - row.prompt_len)


def tokens_left(rows: Sequence[Row]) -> int:
    """The most tokens a row of the batch may still emit (max_new_tokens; a row may stop sooner)."""
    return max((row_tokens_left(r) for r in rows), default=0)


def batch_score(rows: Sequence[Row], scales: Mapping[str, float], solo: Plan | None, tail_weight: float,
                finish_reach: int) -> Score:
    """T_eff with the batch's latency scales, times the weighted cost of the rows' overshoot and spread
    (finish.tail_factor) when `solo` (the one-row plan) is given; for a batch of one row, its regret
    against the best finish (`finish_score`)."""
    left = [row_tokens_left(r) for r in rows]
    memo: dict[int, float] = {}
    if solo is not None and len(rows) == 1 and left[0] > 0:
        return finish_score(solo, scales, left[0], tail_weight, finish_reach)

    def score(p: Prediction) -> float:
        hit = memo.get(id(p))
        if hit is None:
            cost = p.scaled_cost_ns(scales)
            hit = cost / p.emitted
            one = solo.by_key.get((p.chain, p.window)) if solo is not None else None
            if one is not None:
                hit *= 1 + tail_weight * (tail_factor(p, one.scaled_cost_ns(scales), left, cost) - 1)
            memo[id(p)] = hit
        return hit
    return score


def finish_score(plan: Plan, scales: Mapping[str, float], left: int, tail_weight: float, finish_reach: int) -> Score:
    """Score of a one-row batch with `left` tokens to emit: the best T_eff g plus a candidate's regret
    (finish.finish_regret: its cycle's cost beyond the best finish) per token it emits. Far from the end
    (more than FINISH_HORIZON tokens left after any cycle, `finish_reach`) that is exactly its T_eff;
    nearer, it counts the tokens emitted past the end and the cost of the few left, exactly for one row.
    The plan tables the regrets (less the cycle's cost) at the latency table's times (`Finish`, made with
    the plan by the planner thread, else here at the plan's first score this near the end); a batch whose passes run slower or faster (its latency scales) has
    them scaled by its best T_eff over the plan's, which leaves the score its T_eff where the table ends.
    The best candidate scores g, which may be below its T_eff: not `bounded` by T_eff."""
    if left > finish_reach or not plan.predictions:
        return lambda p: p.scaled_cost_ns(scales) / p.emitted
    finish = plan.finish
    if finish is None:   # made on the cycle's path, or for another batch size serving a one-row batch
        finish = plan.finish = Finish.of(plan.predictions, FINISH_HORIZON, finish_reach)
    costs = {id(p): p.scaled_cost_ns(scales) for p in plan.predictions} if scales else None
    stretch = (min(costs[id(p)] / p.emitted for p in plan.predictions) / finish.rate) if costs else 1.0
    rate, excess = finish.rate * stretch, finish.excess

    def score(p: Prediction) -> float:
        cost = costs.get(id(p)) if costs is not None else None
        if cost is None:
            cost = p.scaled_cost_ns(scales)
        t_eff_ns = cost / p.emitted
        beyond = excess.get(id(p))
        if beyond is None:
            return t_eff_ns
        return t_eff_ns + tail_weight * (rate + (cost + stretch * beyond[left]) / p.emitted - t_eff_ns)
    score.bounded = False
    return score
