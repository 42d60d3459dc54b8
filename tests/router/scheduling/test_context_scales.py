"""Context scales: forward times per context length, as the cycles measure them against the latency table."""

from __future__ import annotations

import pytest

from tests.router.scheduling.fakes import FakeBatch, make


def test_a_batch_is_planned_with_the_forward_times_of_its_context_length() -> None:
    """Passes over these rows' context cost the target twice what the profiler's table says: once enough
    cycles measured it, a batch of that context length has its target level scaled by it, its drafter's
    level not (as the table says), and a batch of another context length nothing."""
    from specrouter.router.cycle_report import CycleReport
    from specrouter.contract.calls import ForwardTiming, StepResult

    sched, _ = make({("a", "t"): 0.6, ("b", "t"): 0.5, ("a", "b"): 0.5, ("b", "a"): 0.5}, explore_after_s=1e9,
                    context_min_cycles=3)
    batch = FakeBatch(4)
    chain, window = sched.choose(batch)
    assert chain == ("a", "t")
    plan = sched.plan(4, 0)
    table = sched.plan(4, 0).latency
    rows = list(batch.rows.values())
    passes = {"t": [ForwardTiming(int(2 * table("t", 4, window + 1)), 4, window + 1, 4)],
              "a": [ForwardTiming(int(table("a", 4, 1)), 4, 1, 4)] * window}
    report = CycleReport(chain, window, emitted={r.row_id: [5] for r in rows}, accepted={"t": [1] * 4},
                         proposed={"t": [window] * 4},
                         results={m: StepResult([], [], timings=t) for m, t in passes.items()})

    def scaled_and_raw(b):
        sched.choose(b)
        p = sched.decision_for(b).prediction
        return p, plan.by_key[(p.chain, p.window)]

    for cycle in range(3):
        p, raw = scaled_and_raw(batch)
        assert p == raw                                           # not before 3 cycles measured it
        sched.observe(report, rows, 100_000_000, True, sched.decision_for(batch))
    p, raw = scaled_and_raw(FakeBatch(4))                         # any batch of that context length
    assert p.chain == ("a", "t")
    assert p.level_ns[1] == pytest.approx(2 * raw.level_ns[1])   # the target's level, as its passes measured
    assert p.level_ns[0] == pytest.approx(raw.level_ns[0])       # the drafter's, as the table says
    assert p.cost_ns == pytest.approx(raw.cost_ns + raw.level_ns[1])
    longer = FakeBatch(4)
    for r in longer.rows.values():
        r.tokens += [7] * 40                                         # 43 tokens: another context length
    p, raw = scaled_and_raw(longer)
    assert p == raw


def test_a_model_that_sits_out_is_priced_by_the_target_and_its_own_ratio_fades() -> None:
    """The first passes of a fresh cluster ran at twice the table's times. A drafter measured then and
    left out since must not keep that price (it would stay out because of it): its ratio over the target's
    fades towards 1 in the cycles it sits out, while the target's own ratio follows what it measures. A
    model never measured at a context length is priced like the target there."""
    from specrouter.router.cycle_report import CycleReport
    from specrouter.contract.calls import ForwardTiming, StepResult

    fade = 0.05
    sched, _ = make({("a", "t"): 0.6, ("b", "t"): 0.5, ("a", "b"): 0.5, ("b", "a"): 0.5}, explore_after_s=1e9,
                    context_min_cycles=3, context_alpha=0.5, context_fade_alpha=fade)
    batch = FakeBatch(4)
    sched.choose(batch)
    table = sched.plan(4, 0).latency
    rows = list(batch.rows.values())

    def cycle(ratios: dict[str, float]) -> None:
        chain = tuple(ratios)
        timings = {m: [ForwardTiming(int(r * table(m, 4, 2)), 4, 2, 4)] for m, r in ratios.items()}
        report = CycleReport(chain, 1, emitted={r.row_id: [5] for r in rows}, accepted={"t": [1] * 4},
                             proposed={"t": [1] * 4}, results={m: StepResult([], [], timings=t) for m, t in timings.items()})
        sched.observe(report, rows, 100_000_000, True)

    for _ in range(3):
        cycle({"a": 2.0, "t": 2.0})             # a fresh cluster: everything twice the table
    assert sched.context_scales.value(rows) == pytest.approx({"a": 2.0, "b": 2.0, "t": 2.0})   # b, unmeasured: as t
    for _ in range(3):
        cycle({"a": 1.5, "t": 0.75})            # a measured at twice the target's ratio
    scales = sched.context_scales.value(rows)
    relative = scales["a"] / scales["t"]
    assert scales["a"] < 2.5 and 1.5 < relative < 2.0 and scales["b"] == pytest.approx(scales["t"])
    n = 20
    for _ in range(n):
        cycle({"t": 1.0})                       # the target alone, at the table's times
    t = 1.0 + (scales["t"] - 1.0) * 0.5 ** n    # the target's EMA (alpha 0.5) follows it
    assert sched.context_scales.value(rows) == pytest.approx(
        {"t": t, "b": t, "a": t * (1 + (relative - 1) * (1 - fade) ** n)}, rel=1e-6)
