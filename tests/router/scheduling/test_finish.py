"""Finish (and scoring's scores built on it): a row's last cycles at least cost, windows for how rows finish."""

from __future__ import annotations

import random

import pytest

from tests.router.scheduling.fakes import DECODE_MS, FakeBatch, make


@pytest.mark.parametrize("rate", [0.6, 0.85])
def test_one_row_finishes_at_least_cost(rate) -> None:
    """A row with a few tokens left, decided cycle by cycle: it costs no more than the target alone or
    the best window by T_eff shrunk to fit what is left (each simulated 3,000 times from the plan's own
    distributions and costs; standard errors under 1%). A cycle drafting past the end drops what it
    drafts there, and a row's last token is the target's alone: T_eff misses both."""
    acceptance = {("a", "t"): rate, ("b", "t"): rate, ("a", "b"): 0.5, ("b", "a"): 0.5}
    sched, _ = make(acceptance, explore_after_s=1e9)
    plan = sched.plan(1, 0)
    by_key = plan.by_key
    static = next(p for p in plan.predictions if len(p.chain) > 1)

    def finish(left: int, choose, rng) -> float:
        total = 0.0
        while left > 0:
            p = by_key[choose(left)]
            total += p.cost_ns
            left -= rng.choices(range(len(p.emitted_dist)), p.emitted_dist)[0]
        return total

    def scheduled(left: int) -> tuple:
        batch = FakeBatch(1)
        row = next(iter(batch.rows.values()))
        row.tokens += [7] * (row.max_new_tokens - left)
        return sched.choose(batch)

    rng = random.Random(int(rate * 100))
    for left in (2, 5, 9):
        runs = 3000
        auto = sum(finish(left, scheduled, rng) for _ in range(runs)) / runs
        alone = left * by_key[(("t",), 0)].cost_ns
        shrunk = sum(finish(left, lambda r: (static.chain, min(static.window, r - 1)) if r > 1 else (("t",), 0), rng)
                     for _ in range(runs)) / runs
        assert auto <= 1.02 * min(alone, shrunk), (left, auto, alone, shrunk)


def test_a_one_row_finish_scales_with_the_batchs_passes() -> None:
    """A one-row plan's finish costs, at the latency table's times, are made where a score near the end
    first needs them (the planner thread makes them with the plan); a batch whose passes all run twice as
    slow scores every candidate twice as high, at every number of tokens left, so it decides alike."""
    sched, _ = make({("a", "t"): 0.7, ("b", "t"): 0.7, ("a", "b"): 0.5, ("b", "a"): 0.5}, explore_after_s=1e9)
    from specrouter.router.scheduling.scoring import finish_score

    plan = sched.plan(1, 0)
    assert plan.finish is None and sched.plan(4, 0).finish is None
    finish_score(plan, {}, sched.planner.finish_reach + 1, sched.settings.tail_weight, sched.planner.finish_reach)
    assert plan.finish is None   # far from the end, the score is T_eff: no finish costs made
    finish_score(plan, {}, 1, sched.settings.tail_weight, sched.planner.finish_reach)
    assert plan.finish is not None and sched.planner.make(1, 0, pause=True).finish is not None
    twice = {m: 2.0 for m in DECODE_MS}
    for left in (1, 2, 5, 9, 17, 60):
        plain = finish_score(plan, {}, left, sched.settings.tail_weight, sched.planner.finish_reach)
        slow = finish_score(plan, twice, left, sched.settings.tail_weight, sched.planner.finish_reach)
        for p in plan.predictions:
            assert slow(p) == pytest.approx(2 * plain(p), rel=1e-9)


def test_a_batch_is_planned_for_how_its_rows_finish() -> None:
    """Long windows overshoot a row's last tokens and spread the rows' finishing apart: the more rows and the
    fewer tokens left, the shorter the window; one row with plenty left keeps the T_eff choice."""
    acceptance = {("a", "t"): 0.9, ("b", "t"): 0.8, ("a", "b"): 0.9, ("b", "a"): 0.9}

    def window(rows: int, left: int, tail_weight: float) -> int:
        sched, _ = make(acceptance, explore_after_s=1e9, tail_weight=tail_weight)
        batch = FakeBatch(rows)
        for r in batch.rows.values():
            r.tokens += [7] * (r.max_new_tokens - left)
        chain, w = sched.choose(batch)
        assert chain == ("a", "t")
        return w

    plain = window(16, 60, 0.0)
    assert all(window(rows, left, 0.0) == window(rows, 60, 0.0) for rows, left in ((16, 12), (4, 12)))
    assert window(1, 60, 1.0) == window(1, 60, 0.0)
    assert window(16, 60, 1.0) < plain
    assert window(16, 12, 1.0) < window(16, 60, 1.0)
    assert window(4, 12, 1.0) < window(4, 12, 0.0)


def test_a_batch_waiting_for_one_row_is_planned_for_that_row() -> None:
    """Fifteen rows about to finish and one far behind: the batch soon runs that row alone, so it gets
    about the long window one row would, not the short one of sixteen rows with their mean left."""
    acceptance = {("a", "t"): 0.9, ("b", "t"): 0.8, ("a", "b"): 0.9, ("b", "a"): 0.9}

    def window(lefts: list[int]) -> int:
        sched, _ = make(acceptance, explore_after_s=1e9)
        batch = FakeBatch(len(lefts))
        for r, left in zip(batch.rows.values(), lefts):
            r.tokens += [7] * (r.max_new_tokens - left)
        chain, w = sched.choose(batch)
        assert chain == ("a", "t")
        return w

    behind = window([4] * 15 + [60])
    assert behind > window([8] * 16)             # the same tokens left in all, evenly spread
    assert behind >= window([60]) - 2
