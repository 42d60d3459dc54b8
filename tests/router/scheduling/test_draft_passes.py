"""Draft passes: a lone row's look-ahead drafts, and the lower price of its longer windows."""

from __future__ import annotations

import pytest

from tests.router.scheduling.fakes import Clock, FakeBatch, make


def test_a_lone_rows_drafts_that_look_ahead_price_its_longer_windows_lower() -> None:
    from specrouter.router.cycle_report import CycleReport
    from specrouter.router.scheduling.draft_passes import draft_scale
    from specrouter.contract.calls import ForwardTiming, StepResult

    clock = Clock()
    sched, _ = make({("a", "t"): 0.7}, clock=clock, explore_after_s=1e9)
    before = sched.planner.make(1, 0)
    batch = FakeBatch(1)
    rows = list(batch.rows.values())
    single = before.latency("a", 1, 1)
    for window, fraction in ((3, 0.8), (6, 0.5)):   # the passes after the first took this share of W - 1 single ones
        later = [ForwardTiming(int(fraction * (window - 1) * single), 1, 3, 3)]
        draft = StepResult(tokens=[[7] * window], rows=[None], timings=[ForwardTiming(1_000_000, 1, 1, 1), *later])
        report = CycleReport(("a", "t"), window, emitted={"0": [5]}, accepted={"t": [0]}, proposed={"t": [window]},
                             results={"a": draft})
        sched.observe(report, rows, 20_000_000, True)
    known = sched.draft_passes.value()
    assert known == pytest.approx({("a", 3): 0.8, ("a", 6): 0.5}, rel=1e-6)
    assert [draft_scale(known, "a", w) for w in (2, 3, 4, 5, 6, 8)] == pytest.approx([0.8, 0.8, 0.8, 0.5, 0.5, 0.5],
                                                                                       rel=1e-6)
    assert draft_scale(known, "b", 4) == 1.0
    clock.now += sched.settings.recompute_s   # a plan made a round later carries the measurements
    after = sched.planner.make(1, 0)
    for window in (3, 6):
        was, now = before.by_key[(("a", "t"), window)], after.by_key[(("a", "t"), window)]
        saved = (1 - known[("a", window)]) * (window - 1) * single
        assert was.level_ns[0] - now.level_ns[0] == pytest.approx(saved, rel=1e-6)
