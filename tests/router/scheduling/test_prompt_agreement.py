"""Prompt agreement: the pool's reference, a batch's shift for its prompts, a pair's rates moved to the text now."""

from __future__ import annotations

import math

import pytest

from specrouter.contract.measures import Mode
from specrouter.router.row import Row
from specrouter.router.scheduling.scheduler import Scheduler
from tests.router.scheduling.fakes import DECODE_MS, Clock, FakeBatch, make, snapshot


def _prompt_cycle(chain: tuple[str, ...], rows: list[Row], proposed: int = 2):
    from specrouter.router.cycle_report import CycleReport

    return CycleReport(chain, 2, emitted={r.row_id: [5] for r in rows},
                       accepted={v: [1] * len(rows) for v in chain[1:]},
                       proposed={v: [proposed] * len(rows) for v in chain[1:]}, results={})


def _agreeing(batch: FakeBatch, same: int, n: int = 100) -> FakeBatch:
    for r in batch.rows.values():
        r.prompt_agreement = {(x, y): (same, n) for x in DECODE_MS for y in DECODE_MS if x != y}
    return batch


def test_the_prompt_reference_weighs_rows_by_their_checks_as_the_pool_does() -> None:
    """The pool's prompt agreement per pair is an EMA over checks at position 0 with the profiler's
    acceptance constant: a row counts once per cycle it drafted on that pair, and a mode keeps its own.
    The recent rows' agreement is the same EMA with `prompt_recent_alpha`."""
    sched, _ = make({("a", "t"): 0.7}, explore_after_s=1e9)
    sched.plan(1, 0)                                   # reads the snapshot (acceptance_alpha 0.01)
    a = 0.01
    easy, hard = _agreeing(FakeBatch(1), 90), _agreeing(FakeBatch(1), 50)
    assert sched.prompt_reference(("a", "t", Mode.GREEDY)) is None
    sched.observe(_prompt_cycle(("a", "t"), list(hard.rows.values())), list(hard.rows.values()), 1_000_000, True)
    for _ in range(30):
        sched.observe(_prompt_cycle(("a", "t"), list(easy.rows.values())), list(easy.rows.values()), 1_000_000, True)
    sched.observe(_prompt_cycle(("a", "t"), list(hard.rows.values()), proposed=0), list(hard.rows.values()),
                  1_000_000, True)                     # drafted nothing: no check, no weight
    keep = (1 - a) ** 30
    want = (keep * a * 0.5 + (1 - keep) * 0.9) / (keep * a + (1 - keep))
    assert sched.prompt_reference(("a", "t", Mode.GREEDY)) == pytest.approx(want)
    b = sched.settings.prompt_recent_alpha
    keep = (1 - b) ** 30
    recent = sched.prompts.recent(("a", "t", Mode.GREEDY))
    assert recent == pytest.approx((keep * b * 0.5 + (1 - keep) * 0.9) / (keep * b + (1 - keep)))
    assert sched.prompt_reference(("a", "t", Mode.SAMPLING)) is None
    assert sched.prompt_reference(("b", "t", Mode.GREEDY)) is None


def test_a_batch_is_planned_for_how_its_prompts_compare_with_the_pools() -> None:
    """Rows whose models agree on the prompt more than the pool's rows did are planned with every pair's
    acceptance shifted up (longer windows), less, shifted down; the record is then kept against that
    plan. As the pool's reference catches up with such rows, the shift fades."""
    sched, _ = make({("a", "t"): 0.7, ("b", "t"): 0.7, ("a", "b"): 0.7, ("b", "a"): 0.7}, explore_after_s=1e9)
    s = sched.settings
    usual = _agreeing(FakeBatch(1), 50)
    assert sched.prompts.value(list(usual.rows.values())) == 0         # no reference yet: no shift
    for _ in range(600):
        sched.observe(_prompt_cycle(("a", "t"), list(usual.rows.values())), list(usual.rows.values()), 1_000_000, True)
    chain, window = sched.choose(usual)
    easy = _agreeing(FakeBatch(1), 90)
    easy_chain, easy_window = sched.choose(easy)
    hard = _agreeing(FakeBatch(1), 20)
    hard_chain, hard_window = sched.choose(hard)
    def expected(same: int) -> int:   # 100 positions, shrunk towards the recent rows' 0.5, against the pool's 0.5
        rate = (same + s.prompt_prior_positions * 0.5) / (100 + s.prompt_prior_positions)
        return round(s.prompt_slope * math.log(rate / (1 - rate)) / s.batch_odds_step)

    assert sched.prompts.value(list(usual.rows.values())) == 0
    up, down = sched.prompts.value(list(easy.rows.values())), sched.prompts.value(list(hard.rows.values()))
    assert up == expected(90) > 0 and down == expected(20) < 0
    assert easy_chain == chain and easy_window > window
    assert len(hard_chain) == 1 or hard_window < window
    decision = sched.decision_for(easy)
    assert decision.base == sched.plan(1, 0, common=up).by_key[(easy_chain, easy_window)]
    assert decision.base.emitted > sched.plan(1, 0).by_key[(easy_chain, easy_window)].emitted
    for _ in range(600):                                                # the pool runs such rows a while
        sched.observe(_prompt_cycle(("a", "t"), list(easy.rows.values())), list(easy.rows.values()), 1_000_000, True)
    assert sched.prompts.value(list(easy.rows.values())) == 0


def test_a_pair_left_on_other_text_has_its_rates_moved_to_the_text_now() -> None:
    """A pair's rates are of the rows it ran; when the pool goes on to rows its models agree on less
    (another kind of text) without it, its measured rates move down by the log-odds between the two
    agreements (within prompt_odds_cap), while those of the pair in use, measured on those rows, stay."""
    clock = Clock()
    acceptance = {("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}
    sched, holder = make(acceptance, clock, explore_after_s=1e9, recompute_s=0.0)
    sched.plan(1, 0)                                   # reads the snapshot (acceptance_alpha 0.01)
    tables, prose = _agreeing(FakeBatch(1), 90), _agreeing(FakeBatch(1), 60)
    on_tables = [(("a", "t"), tables, 400), (("b", "t"), tables, 400)]     # both ran on tables
    # then the pool runs prose on (a, t) alone; cycles of the target alone move neither agreement
    on_prose = [(("a", "t"), prose, 1500), (("t",), tables, 300)]

    def feed(s: Scheduler, phases) -> None:
        for chain, batch, cycles in phases:
            rows = list(batch.rows.values())
            for _ in range(cycles):
                s.observe(_prompt_cycle(chain, rows), rows, 1_000_000, True)

    feed(sched, on_tables)
    assert max(abs(x) for x in sched.text_shifts().values()) < 0.05
    feed(sched, on_prose)
    shifts = sched.text_shifts()
    assert shifts[("a", "t", Mode.GREEDY)] == pytest.approx(0.0, abs=1e-6)
    # (b, t) still holds the tables' agreement: logit(0.6) - logit(~0.9), about -1.8, capped at 1.5
    want = max(-1.5, math.log(0.6 / 0.4) - math.log(0.9 / 0.1))
    assert shifts[("b", "t", Mode.GREEDY)] == pytest.approx(want, abs=0.05)
    holder["snapshot"] = snapshot(acceptance)          # the next snapshot: estimates made afresh
    clock.now += 1
    estimates = sched.plan(1, 0).estimates
    assert estimates.observed[("a", "t", Mode.GREEDY)][0].rate == pytest.approx(0.9, abs=0.005)
    moved = 1 / (1 + math.exp(-(math.log(9) + shifts[("b", "t", Mode.GREEDY)])))
    assert estimates.observed[("b", "t", Mode.GREEDY)][0].rate == pytest.approx(moved) and moved < 0.8
    # with text_slope 0 the rates stay as measured
    still, _ = make(acceptance, explore_after_s=1e9, text_slope=0.0)
    feed(still, on_tables + on_prose)                  # the same agreements as above
    assert still.text_shifts() == {}
    assert still.plan(1, 0).estimates.observed[("b", "t", Mode.GREEDY)][0].rate == pytest.approx(0.9)
