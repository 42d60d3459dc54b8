"""The scheduler replay: the costs it charges are the ones the scheduler learns, and it is deterministic."""

from __future__ import annotations

import pytest

from benchmarks.scheduler_replay import Costs, Replay, replay_workloads
from specrouter.router.chain import TARGET_ONLY_BLOCK
from specrouter.router.scheduling.settings import SchedulerSettings

NEW_TOKENS = 24


def _traces(easy: int = 8, hard: int = 0) -> dict:
    """Prompts on which the drafter's greedy tokens match the target's for `easy` (every position) or
    `hard` tokens; its agreement with the target on the prompt alike."""
    def prompt(kind: str, accepted: int, agree: int) -> dict:
        return {"kind": kind, "prompt_ids": list(range(1, 11)), "accepted": {"d": [accepted] * NEW_TOKENS},
                "agreement": [["d", "t", agree, 100], ["t", "d", agree, 100]]}
    prompts = [prompt("repetitive", easy, 90) for _ in range(4)] + [prompt("prose", hard, 40) for _ in range(4)]
    return {"target": "t", "models": ["d", "t"], "new_tokens": NEW_TOKENS, "depth": 8, "prompts": prompts}


# slow enough that the router's snapshot of the profiler (every second) refreshes every few requests
COSTS = Costs({"d": 10.0, "t": 40.0}, call_ms=80.0)


def test_the_scheduler_learns_the_costs_the_replay_charges() -> None:
    replay = Replay(_traces(), COSTS, SchedulerSettings(explore_after_s=1e9))
    for p in _traces()["prompts"][:2]:
        replay.run(p)
    replay.clock.now += 1.0                  # the next snapshot: the plan is made again
    plan = replay.scheduler.plan(1, 0)
    for chain, window in ((("d", "t"), 3), (("d", "t"), 8), (("t",), 0)):
        predicted = plan.by_key[(chain, window)].cost_ns / 1e6
        assert predicted == pytest.approx(COSTS.cycle_ms(chain, window), rel=1e-6)


def test_a_replay_charges_each_cycle_by_what_the_traces_accept() -> None:
    """A static window 4 on a drafter the target always agrees with emits 5 tokens a cycle: 24 tokens
    take 5 cycles; the target alone, a block of TARGET_ONLY_BLOCK tokens a call, takes 24 / TARGET_ONLY_BLOCK."""
    replay = Replay(_traces(), COSTS, SchedulerSettings())
    easy, hard = _traces()["prompts"][0], _traces()["prompts"][-1]
    assert replay.run(easy, (("d", "t"), 4)) == pytest.approx(5 * COSTS.cycle_ms(("d", "t"), 4))
    assert replay.run(hard, (("d", "t"), 4)) == pytest.approx(NEW_TOKENS * COSTS.cycle_ms(("d", "t"), 4))
    assert replay.run(hard, (("t",), 0)) == pytest.approx(NEW_TOKENS // TARGET_ONLY_BLOCK * COSTS.cycle_ms(("t",), 0))


GROWING = Costs({"d": 10.0, "t": 40.0}, call_ms=80.0, growth={"d": 0.1, "t": 0.5, "call": 0.25})


def test_a_wave_runs_at_the_batch_size_of_its_rows_left() -> None:
    """A wave of an easy row (window 4 emits 5 tokens a cycle: 24 tokens in 5 cycles) and a hard one (1 a
    cycle: 24 cycles) runs 5 cycles of two rows, then 19 of the hard row alone, each at its batch's cost."""
    replay = Replay(_traces(), GROWING, SchedulerSettings())
    easy, hard = _traces()["prompts"][0], _traces()["prompts"][-1]
    two, one = GROWING.cycle_ms(("d", "t"), 4, 2), GROWING.cycle_ms(("d", "t"), 4, 1)
    assert two > one
    assert replay.run_wave([easy, hard], (("d", "t"), 4)) == pytest.approx(5 * two + 19 * one)
    assert replay.run_wave([easy, easy], (("d", "t"), 4)) == pytest.approx(5 * two)


def test_the_scheduler_learns_what_a_row_adds_to_a_cycle() -> None:
    replay = Replay(_traces(), GROWING, SchedulerSettings(explore_after_s=1e9))
    prompts = _traces()["prompts"]
    for wave in (prompts[:2], prompts[2:4]):
        replay.run_wave(wave)
    replay.clock.now += 1.0
    _assert_planned_at_charged_costs(replay, 2)


def test_call_overheads_are_learned_per_batch_size() -> None:
    """Waves whose rows finish apart run cycles of two rows, then of one: each batch size is planned at
    its own call cost (one overhead for every size priced both at whichever ran last)."""
    replay = Replay(_traces(), GROWING, SchedulerSettings(explore_after_s=1e9))
    easy, hard = _traces()["prompts"][0], _traces()["prompts"][-1]
    for _ in range(2):
        replay.run_wave([easy, hard], (("d", "t"), 4))   # 5 cycles of two rows, then 19 of one
    replay.clock.now += 1.0
    for batch in (1, 2):
        _assert_planned_at_charged_costs(replay, batch)


def _assert_planned_at_charged_costs(replay: Replay, batch: int) -> None:
    plan = replay.scheduler.plan(batch, 0)
    for chain, window in ((("d", "t"), 3), (("d", "t"), 8), (("t",), 0)):
        predicted = plan.by_key[(chain, window)].cost_ns / 1e6
        assert predicted == pytest.approx(GROWING.cycle_ms(chain, window, batch), rel=1e-6)


def test_auto_finds_the_long_window_on_easy_text_and_the_target_on_hard() -> None:
    cells = replay_workloads(_traces(), COSTS, SchedulerSettings(), passes=2, windows=(2, 4, 8))
    by_kind = {c["kind"]: c for c in cells}
    assert set(by_kind) == {"repetitive", "prose", "switching:prose>repetitive"}
    assert by_kind["repetitive"]["best_static"] == "d,t W8"
    assert by_kind["prose"]["best_static"] == "t"
    # the first hard request after easy ones runs the long window until the pool's estimates fall (here
    # the drafter goes from matching every token to none, and that request takes 9 such cycles)
    for cell in cells:
        assert cell["auto_speed_over_best_static"] > 0.85
    assert by_kind["switching:prose>repetitive"]["auto_speed_over_best_static"] > 1.0   # the best of both
    assert cells == replay_workloads(_traces(), COSTS, SchedulerSettings(), passes=2, windows=(2, 4, 8))


def test_traces_accept_what_the_real_chain_accepts() -> None:
    """On the demo pool, a static (drafter, target) chain at window 8 run by the engine accepts, cycle by
    cycle, exactly what the traces say: min(L(t), 8) at each position t where a cycle starts."""
    import torch

    from benchmarks.scheduler_replay import build_traces
    from specrouter.inprocess import InProcessPool
    from specrouter.contract.calls import SamplingParams
    from tests.conftest import DEMO_POOL

    new_tokens, depth = 12, 8
    traces = build_traces(DEMO_POOL, per_kind=1, new_tokens=new_tokens, depth=depth)
    assert sorted(p["kind"] for p in traces["prompts"]) == ["code", "prose", "repetitive"]
    pool = InProcessPool.open(DEMO_POOL, dtype=torch.float32)
    compared = 0
    for prompt in traces["prompts"]:
        for drafter, lengths in prompt["accepted"].items():
            assert len(lengths) == new_tokens and all(0 <= n <= depth for n in lengths)
            cycles: list[int] = []
            pool.generate_ids([prompt["prompt_ids"]], (drafter, pool.target), depth, [SamplingParams()],
                              new_tokens + depth + 1, on_cycle=lambda r: cycles.append(r.accepted[pool.target][0]))
            t = 0
            for accepted in cycles:
                if t >= new_tokens:
                    break
                assert accepted == min(lengths[t], depth), (prompt["kind"], drafter, t)
                compared += 1
                t += accepted + 1
    assert compared >= 6


def test_a_run_off_counts_auto_target_only_and_the_fastest_statics_alone() -> None:
    """As the report: a screening pass of every static, then run-off passes of auto, target-only and the
    `runoff_top` fastest statics of the screening, which alone are counted."""
    cells = replay_workloads(_traces(), COSTS, SchedulerSettings(), passes=2, windows=(2, 4, 8), runoff_top=1)
    by_kind = {c["kind"]: c for c in cells}
    assert set(by_kind["repetitive"]["ms_per_token"]) == {"auto", "hindsight", "t", "d,t W8"}
    assert set(by_kind["prose"]["ms_per_token"]) == {"auto", "hindsight", "t", "d,t W2"}
    # on easy text a cycle at window 8 (2 calls, 8 drafts, a target pass) emits 9 tokens: 24 in 3 cycles
    easy = by_kind["repetitive"]["ms_per_token"]
    assert easy["d,t W8"] == pytest.approx(3 * (2 * 80 + 8 * 10 + 40) / NEW_TOKENS, rel=1e-6)
    assert easy["t"] == pytest.approx((80 + TARGET_ONLY_BLOCK * 40) / TARGET_ONLY_BLOCK, rel=1e-6)
