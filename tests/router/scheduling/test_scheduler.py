"""The Scheduler front as a whole: its choice from a controlled snapshot, and decisions cheap once planned."""

from __future__ import annotations

from tests.router.scheduling.fakes import FakeBatch, make


def test_high_acceptance_picks_the_cheap_drafter_and_a_long_window() -> None:
    sched, _ = make({("a", "t"): 0.95, ("b", "t"): 0.95, ("a", "b"): 0.95, ("b", "a"): 0.95},
                    explore_after_s=1e9)
    chain, window = sched.choose(FakeBatch(1))
    assert chain == ("a", "t") and window >= 6
    plan = sched.plan(1, 0)
    assert plan.predictions[0].t_eff_ns <= min(p.t_eff_ns for p in plan.predictions)
    assert {(p.chain, p.window) for p in plan.predictions} >= {(("t",), 0), (("a", "b", "t"), 8)}


def test_low_acceptance_picks_target_only() -> None:
    sched, _ = make({pair: 0.05 for pair in [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]}, explore_after_s=1e9)
    assert sched.choose(FakeBatch(4)) == (("t",), 0)


def test_decisions_are_cheap_once_planned() -> None:
    sched, _ = make({("a", "t"): 0.9}, explore_every_cycles=10**9, recompute_s=1e9)
    batch = FakeBatch(4)
    sched.choose(batch)
    plans = sched.counts["plans"]
    for _ in range(200):
        sched.choose(batch)
    assert sched.counts["plans"] == plans          # no re-planning on the decision path
    assert sched.decision_ns.get() < 1e6           # well under a millisecond per decision


def test_a_cycles_late_prefill_is_not_taken_for_the_routers_overhead() -> None:
    """A cycle that first prefilled rows on a model left out of their join spent that time as a catch-up
    (`catch_up_ns` prices it): the router's overhead per cycle, which every chain's cost carries, is the
    cycle's wall time less its calls and that prefill."""
    from specrouter.router.cycle_report import CycleReport
    from specrouter.contract.calls import ForwardTiming, StepResult

    sched, _ = make({("a", "t"): 0.7}, explore_after_s=1e9)
    rows = list(FakeBatch(1).rows.values())
    step = StepResult(tokens=[[5]], rows=[None], timings=[ForwardTiming(1_000_000, 1, 1, 1)])
    report = CycleReport(("a", "t"), 1, emitted={"0": [5]}, accepted={"t": [0]}, proposed={"t": [1]},
                         results={"a": step, "t": step}, call_ns={"a": 2_000_000, "t": 3_000_000},
                         late_prefill_ns=40_000_000)
    sched.observe(report, rows, 46_000_000, True)
    assert sched.cycle_overheads.value(1) == 1_000_000
