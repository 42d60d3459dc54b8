"""Row records: each row's acceptance against its prediction, and the batch's shift of the plan that follows."""

from __future__ import annotations

import math
from dataclasses import astuple

import pytest

from specrouter.router.chain import TARGET_ONLY_BLOCK
from specrouter.router.scheduling.candidates import chain_pairs
from specrouter.router.scheduling.ledger import Tally
from specrouter.router.scheduling.settings import SchedulerSettings
from tests.router.scheduling.fakes import FakeBatch, make


def test_batch_shift_compares_the_rows_with_their_prediction() -> None:
    from specrouter.router.scheduling.acceptance import shifted
    from specrouter.router.scheduling.row_records import batch_shift

    def rows(*records):
        return [Tally(*record) for record in records]

    assert batch_shift(rows([0, 0, 0, 0]), 16, 0.25, 1.5, 0.5) == 0                  # nothing to compare yet
    assert batch_shift(rows([40, 100, 40, 100]), 16, 0.25, 1.5, 0.5) == 0            # as predicted
    # realized 0.2 against 0.8 predicted: logit difference -2.77, clipped to -1.5, = -6 steps of 0.25
    assert batch_shift(rows([10, 50, 40, 50], [10, 50, 40, 50]), 16, 0.25, 1.5, 0.5) == -6
    # the same rate on a handful of checks is mostly the prediction still (16 pseudo-checks at 0.8)
    few = batch_shift(rows([1, 5, 4, 5]), 16, 0.25, 1.5, 0.5)
    rho = (1 + 16 * 0.8) / (5 + 16)
    assert few == round((math.log(rho / (1 - rho)) - math.log(4)) / 0.25) and -6 < few < 0
    # better than predicted: up, but only as far as `up` (0.5 = 2 steps)
    assert batch_shift(rows([50, 50, 25, 50]), 16, 0.25, 1.5, 0.5) == 2
    assert batch_shift(rows([10, 50, 40, 50]), 16, 0.0, 1.5, 0.5) == 0               # switched off
    assert shifted(0.5, math.log(3)) == pytest.approx(0.75) and shifted(1.0, -1.0) == 1.0


def test_a_batch_drafting_worse_than_the_pool_is_planned_for_what_it_does() -> None:
    acceptance = {("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}
    sched, _ = make(acceptance, explore_after_s=1e9)
    usual = sched.choose(FakeBatch(2))
    hard = FakeBatch(2)
    for r in hard.rows.values():      # these rows accept 2 in 10 where 9 in 10 were predicted
        sched.records[r] = Tally(20.0, 100.0, 90.0, 100.0)
    chain, window = sched.choose(hard)
    assert usual[0] == ("a", "t") and (len(chain) == 1 or window < usual[1])
    decision = sched.decision_for(hard)
    assert decision.base == sched.plan(2, 0).by_key[(chain, window)]        # measured against the pool's plan
    assert decision.prediction.emitted < decision.base.emitted


def test_observe_keeps_each_rows_record_against_the_pools_prediction() -> None:
    from specrouter.router.cycle_report import CycleReport

    sched, _ = make({("a", "t"): 0.5}, explore_after_s=1e9, row_memory=0.5)
    batch = FakeBatch(2)
    chain, window = sched.choose(batch, ("a", "t"), 2)
    decision = sched.decision_for(batch)
    rows = list(batch.rows.values())
    report = CycleReport(chain, window, emitted={r.row_id: [5] for r in rows}, accepted={"t": [2, 0]},
                         proposed={"t": [2, 2]}, results={})
    for _ in range(2):
        sched.observe(report, rows, 1_000_000, True, decision)
    exp_acc, exp_tried = decision.base.checks[0]
    # two cycles, the first weighing half: row 0 accepted both drafts (2 checks), row 1 none (1 check)
    assert astuple(sched.records[rows[0]]) == pytest.approx((3.0, 3.0, 1.5 * exp_acc, 1.5 * exp_tried))
    assert astuple(sched.records[rows[1]]) == pytest.approx((0.0, 1.5, 1.5 * exp_acc, 1.5 * exp_tried))


def test_a_rows_record_ages_through_cycles_without_drafts() -> None:
    """A row that went to target-only on a bad streak drafts nothing, so nothing new enters its record;
    the record still ages, so the batch's shift returns to the pool's rate and the chain gets a new try."""
    from specrouter.router.cycle_report import CycleReport
    from specrouter.router.scheduling.row_records import batch_shift

    s = SchedulerSettings(explore_after_s=1e9)
    sched, _ = make({("a", "t"): 0.5}, explore_after_s=1e9)
    batch = FakeBatch(1)
    (row,) = batch.rows.values()
    sched.records[row] = Tally(20.0, 100.0, 90.0, 100.0)    # 2 in 10 accepted where 9 in 10 were predicted
    def shift() -> int:
        return batch_shift([sched.records[row]], s.row_prior_checks, s.batch_odds_step, s.batch_odds_down,
                           s.batch_odds_up)
    assert shift() == -round(s.batch_odds_down / s.batch_odds_step)
    chain, window = sched.choose(batch, ("t",))
    report = CycleReport(chain, window, emitted={row.row_id: [5]}, accepted={"t": [0]}, proposed={"t": [0]},
                         results={})
    shifts = []
    for _ in range(60):
        sched.observe(report, [row], 1_000_000, True, sched.decision_for(batch))
        shifts.append(shift())
    assert astuple(sched.records[row]) == pytest.approx(tuple(x * s.row_memory**60 for x in [20.0, 100.0, 90.0, 100.0]))
    assert shifts == sorted(shifts) and shifts[0] < 0 and shifts[-1] == 0


def test_a_batchs_own_rate_is_shrunk_per_row() -> None:
    """Each row's streak regresses on its own, so the record's prior is `row_prior_checks` per row: a batch
    of rows alike shifts as one of them does. A lone row 38 of 40 where 0.8 was predicted: rho = (38 + 16 *
    0.8) / (40 + 16), logit(rho) - logit(0.8) = 0.89, 4 steps of 0.25 (one prior of 64 for the batch put
    the lone row at 2 and four such rows at 4)."""
    from specrouter.router.scheduling.row_records import batch_shift

    assert SchedulerSettings().row_prior_checks == 16.0
    lone = [Tally(38.0, 40.0, 32.0, 40.0)]
    four = [Tally(38.0, 40.0, 32.0, 40.0) for _ in range(4)]
    def shift(records: list[Tally]) -> int:
        return batch_shift(records, 16.0, 0.25, 1.5, 3.0)
    assert shift(lone) == 4
    assert shift(four) == 4
    # a row that accepts as predicted leaves the batch where the prediction is
    four[0] = Tally(32.0, 40.0, 32.0, 40.0)
    assert shift(four) == 2   # (3 * 38 + 32 + 64 * 0.8) / (160 + 64): logit 0.61 above 0.8's


def _planned_after_record(rate: float, record: list[float]):
    """A two-row batch on (a, t) with every pair at `rate`, whose rows then carry `record`: the shifted
    plan's key, that plan, and the unshifted one."""
    sched, _ = make({("a", "t"): rate, ("b", "t"): rate, ("a", "b"): rate, ("b", "a"): rate}, explore_after_s=1e9)
    batch = FakeBatch(2)
    chain, _ = sched.choose(batch)
    assert chain == ("a", "t")
    for r in batch.rows.values():
        sched.records[r] = Tally(*record)
    sched.choose(batch)
    # (the one-row plan is shifted too; a shift of every pair is planned as a common one)
    (key,) = [k for k in sched.planner.plans if (k.shift or k.common) and k.greedy == 2]
    return key, sched.planner.plans[key], sched.plan(2, 0)


def test_a_batch_shift_up_moves_only_the_pairs_its_rows_ran() -> None:
    """The rows' record is of the standing chain's pairs: a batch beating the prediction on (a, t) is
    planned with (a, t) shifted, while chains of other pairs keep the pool's rates."""
    key, shifted_plan, base = _planned_after_record(0.6, [90.0, 100.0, 60.0, 100.0])
    assert key.shift > 0 and key.pairs == frozenset({("a", "t")})
    for p in shifted_plan.predictions:
        if len(p.chain) == 1:
            continue
        if ("a", "t") in chain_pairs(p.chain):
            assert p.emitted > base.by_key[(p.chain, p.window)].emitted
        else:
            assert p.emitted == base.by_key[(p.chain, p.window)].emitted


def test_a_batch_shift_down_moves_every_pair() -> None:
    """Rows drafting worse than predicted on (a, t) are planned with every pair shifted down, so that no
    chain they never ran gains on the standing one; target-only, with no pair, keeps its cost."""
    key, shifted_plan, base = _planned_after_record(0.7, [30.0, 100.0, 70.0, 100.0])
    assert key.common < 0 and key.shift == 0 and key.pairs is None
    for p in shifted_plan.predictions:
        before = base.by_key[(p.chain, p.window)]
        if len(p.chain) == 1:
            assert p.emitted == before.emitted == TARGET_ONLY_BLOCK
        else:
            assert p.emitted < before.emitted
