"""The planner thread and its plans: inline refreshes, rounds, plans too old to serve, stand-ins, its niceness."""

from __future__ import annotations

import math
import os
import sys
import threading
import time

import pytest

from specrouter.router.measurements import snapshot_from_pb
from specrouter.router.scheduling.plans import PlanKey
from specrouter.router.scheduling.scheduler import Scheduler
from specrouter.router.scheduling.settings import SchedulerSettings
from tests.router.scheduling.fakes import DECODE_MS, Clock, FakeBatch, make, snapshot, snapshot_pb


def test_plans_are_refreshed_inline_when_the_planner_has_stopped() -> None:
    clock = Clock()
    sched, holder = make({("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}, clock,
                         explore_after_s=1e9, recompute_s=0.01)
    sched.start()
    assert sched.choose(FakeBatch(1))[0] == ("a", "t")
    sched.close()
    sched.planner.thread.join(timeout=5)
    assert not sched.planner.thread.is_alive()
    holder["snapshot"] = snapshot({pair: 0.02 for pair in [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]})
    clock.now += 1
    assert sched.choose(FakeBatch(1)) == (("t",), 0)


@pytest.mark.parametrize("setting, passes_here, thread", [
    (None, False, True), (None, True, False), (True, True, True), (False, False, False)])
def test_planning_stays_on_the_cycles_thread_where_the_models_run_on_the_routers_cores(setting, passes_here,
                                                                                     thread) -> None:
    """By default a planner thread runs where the models' passes run elsewhere, and none where they run on
    the router's cores (in the router, or in workers on its machine's CPU: a planning thread beside them
    slows them); the setting overrides either way. Without the thread, a decision that finds its plan stale
    remakes it."""
    clock = Clock()
    pairs = [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]
    sched, holder = make({pair: 0.9 for pair in pairs}, clock, explore_after_s=1e9, recompute_s=0.01,
                         planner_thread=setting)
    sched.start(passes_here=passes_here)
    try:
        assert (sched.planner.thread is not None) == thread
        assert sched.choose(FakeBatch(1))[0] == ("a", "t")
        if not thread:
            holder["snapshot"] = snapshot({pair: 0.02 for pair in pairs})
            clock.now += 1
            assert sched.choose(FakeBatch(1)) == (("t",), 0)
    finally:
        sched.close()


def test_the_planner_remakes_only_the_plans_asked_for_since_they_were_made() -> None:
    clock = Clock()
    pairs = [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]
    sched, holder = make({pair: 0.9 for pair in pairs}, clock, explore_after_s=1e9, recompute_s=1000.0,
                         plan_max_age_s=1e9)
    asked, idle = sched.plan(2, 0), sched.plan(3, 0)
    sched.start()    # its first round is 1000 s away: the rounds below are called here
    try:
        holder["snapshot"] = snapshot({pair: 0.02 for pair in pairs})   # every plan is stale now
        clock.now += 2000
        assert sched.plan(2, 0) is asked          # served as it is; the next round remakes it
        sched.planner.refresh()
        fresh = sched.plan(2, 0)
        assert fresh is not asked and fresh.predictions[0].chain == ("t",)
        key = PlanKey(greedy=3, sampling=0, coupled=0, common=0, shift=0, pairs=None)
        assert sched.planner.plans[key] is idle   # not asked for since it was made: left
        assert sched.plan(3, 0) is idle
        sched.planner.refresh()
        assert sched.plan(3, 0) is not idle
    finally:
        sched.close()


def test_a_plan_too_old_from_a_replaced_snapshot_is_not_served() -> None:
    """A composition asked for again after `plan_max_age_s`, the snapshot having changed since its plan
    was made, gets a plan of the latest snapshot: made now, or (a shift) the nearest servable shift's,
    never the old ranking. The planner's rounds are 1000 s apart: it remakes nothing here itself."""
    clock = Clock()
    pairs = [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]
    sched, holder = make({pair: 0.9 for pair in pairs}, clock, explore_after_s=1e9, recompute_s=1000.0,
                         plan_max_age_s=1.0)
    old, old_shifted = sched.plan(1, 0), sched.plan(1, 0, common=-4)
    assert old.predictions[0].chain != ("t",)
    sched.start()
    try:
        assert sched.planner.thread.is_alive()   # its first round is `recompute_s` away
        holder["snapshot"] = snapshot({pair: 0.02 for pair in pairs})   # drafts are now nearly all rejected
        clock.now += 0.5
        assert sched.plan(1, 0) is old                     # young enough: served as it is
        clock.now += 1.0
        fresh_shifted = sched.plan(1, 0, common=-4)        # nothing servable near it: made now
        assert fresh_shifted is not old_shifted and fresh_shifted.made_at == clock.now
        assert fresh_shifted.predictions[0].chain == ("t",)
        stand_ins = sched.counts["stand_ins"]
        assert sched.plan(1, 0, common=-3) is fresh_shifted   # the nearest servable shift stands in
        assert sched.counts["stand_ins"] == stand_ins + 1
        fresh = sched.plan(1, 0)          # the unshifted plan is never a stand-in's: made now
        assert fresh is not old and fresh.predictions[0].chain == ("t",)
        clock.now += 5.0                  # old, but of the latest snapshot: still served
        assert sched.plan(1, 0) is fresh
    finally:
        sched.close()


def test_a_shift_not_planned_yet_wakes_the_planner() -> None:
    """A decision asking for a shift the planner has not made is served by the nearest planned shift, and
    the planner makes that shift's plan at once, not at its next round (`recompute_s`, here 1000 s away)."""
    clock = Clock()
    pairs = [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]
    sched, _ = make({pair: 0.9 for pair in pairs}, clock, explore_after_s=1e9, recompute_s=1000.0)
    unshifted = sched.plan(1, 0)          # made inline: there is no other plan yet
    sched.start()
    try:
        assert sched.planner.thread.is_alive()   # its first round is `recompute_s` away
        assert sched.plan(1, 0, common=-4) is unshifted     # the stand-in
        assert sched.counts["stand_ins"] == 1
        for _ in range(500):
            if PlanKey(1, 0, 0, -4, 0, None) in sched.planner.plans:
                break
            time.sleep(0.01)
        shifted_plan = sched.plan(1, 0, common=-4)
        assert shifted_plan is not unshifted and sched.counts["stand_ins"] == 1
        # every pair 1.0 down in log-odds (4 steps of 0.25): fewer tokens a cycle at every window
        assert all(shifted_plan.by_key[k].emitted < p.emitted for k, p in unshifted.by_key.items() if k[1] > 0)
    finally:
        sched.close()
    sched.planner.thread.join(timeout=5)
    assert not sched.planner.thread.is_alive()        # closing wakes it to stop, not after its round
    from specrouter.router.server import schedule_pb
    assert schedule_pb(sched, 1, 0).stand_ins == 1    # on the wire, for the report


def test_a_batchs_new_mix_of_matches_is_served_by_the_nearest_mix_while_the_planner_makes_it() -> None:
    """With the planner thread, a batch of several rows whose mix of lookup matches has no plan yet is served
    by the plan of the nearest mix (by the rows' sorted match lengths), and the thread makes its own at
    once; a lone row's match, which decides between the lookup's chains and the models', is planned inline
    as before. Without the thread (the router holding the models) a mix within half the batch's rows of a
    planned one (in match lengths summed over its rows) is served by it, and one farther is planned."""
    from specrouter.router.lookup import LOOKUP, by_match
    from specrouter.router.scheduling.plans import match_distance

    acceptance = {("a", "t"): 0.7, ("b", "t"): 0.75, ("a", "b"): 0.8}
    acceptance.update({(by_match(LOOKUP, m), v): 0.2 + 0.2 * m for m in range(4) for v in ("a", "b", "t")})
    clock = Clock()
    holder = {"snapshot": snapshot(acceptance)}
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(explore_after_s=1e9, recompute_s=1000.0),
                      lambda: holder["snapshot"], clock=clock, levels=[LOOKUP])
    far = sched.plan(4, 0, match=(0, 0, 0, 0))           # farther from (0, 0, 2, 2) than the next
    near = sched.plan(4, 0, match=(0, 0, 3, 3))          # both inline: no thread yet, and 6 apart
    alone = sched.plan(1, 0, match=3)
    assert sched.counts["stand_ins"] == 0
    assert sched.plan(4, 0, match=(0, 0, 1, 1)) is far and sched.counts["stand_ins"] == 1   # 2 apart: served
    apart = sched.plan(4, 0, match=(0, 1, 1, 1))         # 3 from the nearest: planned
    assert apart is not far and apart is not near and sched.counts["stand_ins"] == 1
    assert match_distance((0, 0, 3, 3), (0, 0, 2, 2)) == 2 and match_distance(0, (0, 0, 2, 2)) == 4
    assert match_distance(None, 2) == math.inf and match_distance(3, 1) == 2
    sched.start()
    try:
        assert sched.plan(4, 0, match=(0, 0, 2, 2)) is near             # the stand-in
        assert sched.counts["stand_ins"] == 2
        lone = sched.plan(1, 0, match=2)                                 # a lone row's match: made inline
        assert lone is not alone and sched.counts["stand_ins"] == 2
        key = PlanKey(4, 0, 0, 0, 0, None, (0, 0, 2, 2))
        for _ in range(500):
            if key in sched.planner.plans:
                break
            time.sleep(0.01)
        made = sched.plan(4, 0, match=(0, 0, 2, 2))
        assert made is not near and made is sched.planner.plans[key] and sched.counts["stand_ins"] == 2
        fresh = Scheduler(list(DECODE_MS), "t", SchedulerSettings(explore_after_s=1e9), lambda: holder["snapshot"],
                          clock=Clock(), levels=[LOOKUP]).planner.make(4, 0, match=(0, 0, 2, 2))
        assert [(p.chain, p.window, p.emitted) for p in made.predictions] == \
               [(p.chain, p.window, p.emitted) for p in fresh.predictions]
    finally:
        sched.close()


def test_the_planner_survives_a_failing_snapshot() -> None:
    clock = Clock()
    pairs = [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]
    good, bad = snapshot({pair: 0.9 for pair in pairs}), snapshot_pb({pair: 0.02 for pair in pairs})
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] in (2, 3):
            raise RuntimeError("profiler unreachable")
        return good if calls["n"] < 4 else snapshot_from_pb(bad)

    # a decision every cycle: a standing decision reads the snapshot's version, a call of its own
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(explore_after_s=1e9, recompute_s=0.01, decision_cycles=1),
                      flaky, clock=clock)
    sched.choose(FakeBatch(1))   # planned inline, with the first snapshot
    sched.start()
    try:
        for _ in range(500):     # the planner fails twice, then picks up the new snapshot
            clock.now += 1
            if sched.plan(1, 0).predictions[0].chain == ("t",):
                break
            time.sleep(0.01)
        assert sched.plan(1, 0).predictions[0].chain == ("t",) and calls["n"] >= 4
        assert sched.planner.thread.is_alive()
    finally:
        sched.close()


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is Linux's")
@pytest.mark.parametrize("nice", [0, 7])
def test_the_planner_thread_runs_nicer_than_the_router(nice: int) -> None:
    """The planner raises its own thread's niceness by `planner_nice`; the thread that started it (the
    router's, which runs the cycles) keeps its own."""
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    sched, _ = make({("a", "t"): 0.9}, recompute_s=1000.0, planner_nice=nice)
    sched.start()
    try:
        tid = sched.planner.thread.native_id
        expected = min(19, own + nice)
        deadline = time.monotonic() + 5
        while os.getpriority(os.PRIO_PROCESS, tid) != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.getpriority(os.PRIO_PROCESS, tid) == expected
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
    finally:
        sched.close()


def test_plans_apart_by_a_records_shift_share_the_chains_it_does_not_move() -> None:
    """A record's shift moves the pairs of the chain the rows ran: a plan made for it within a round of
    another recomputes only the chains through those pairs, and prices every chain as a plan made from
    scratch would. A round later nothing is shared, so the router's overheads measured since enter."""
    from specrouter.router.scheduling.candidates import chain_pairs

    acceptance = {("a", "t"): 0.8, ("b", "t"): 0.6, ("a", "b"): 0.7}
    clock = Clock()
    sched, _ = make(acceptance, clock, explore_after_s=1e9)
    fresh, _ = make(acceptance, Clock(), explore_after_s=1e9)
    moved_pairs = frozenset({("a", "t")})
    base = sched.planner.make(1, 0, common=1)
    moved = sched.planner.make(1, 0, common=1, shift=2, pairs=moved_pairs)
    alone = fresh.planner.make(1, 0, common=1, shift=2, pairs=moved_pairs)
    assert moved.by_key.keys() == alone.by_key.keys() == base.by_key.keys()
    through = 0
    for key, p in moved.by_key.items():
        assert p.t_eff_ns == pytest.approx(alone.by_key[key].t_eff_ns, rel=1e-9), key
        if moved_pairs & set(chain_pairs(key[0])):
            through += 1
            assert p is not base.by_key[key] and p.emitted > base.by_key[key].emitted
        else:
            assert p is base.by_key[key]   # shared, not recomputed
    assert through == len(sched.planner.windows(("a", "t")))
    clock.now += sched.settings.recompute_s
    later = sched.planner.make(1, 0, common=1)
    assert all(later.by_key[key] is not p for key, p in base.by_key.items())


def test_without_a_planner_thread_plans_past_the_inline_budget_give_way_to_the_nearest() -> None:
    """Where no planner thread runs, every plan is made on the cycle's path. While those plans have taken
    more than `inline_planning_share` of the router's time lately, a new shift is served by the nearest
    plan of its composition within `over_budget_reach` steps (a farther one is made), and a stale plan
    stands while it may serve (`plan_max_age_s`); once the share has faded below it, plans are made
    again."""
    clock = Clock()
    sched, holder = make({("a", "t"): 0.7, ("b", "t"): 0.75, ("a", "b"): 0.8}, clock, explore_after_s=1e9,
                         recompute_s=0.01, inline_planning_share=0.02)
    predict = sched.planner._predict_chain

    def slow(*args, **kwargs):   # each chain priced takes 10 ms of the planner's clock: 4 chains a plan
        clock.now += 0.010
        return predict(*args, **kwargs)

    sched.planner._predict_chain = slow
    first = sched.plan(1, 0)
    assert sched.planner.inline_share(clock.now) == pytest.approx(0.04)
    assert sched.settings.over_budget_reach == 2
    assert sched.plan(1, 0, common=2) is first and sched.counts["stand_ins"] == 1   # 2 steps away: served
    far = sched.plan(1, 0, common=-3)   # 3 steps away: a plan of another text's shift would mislead, made
    assert far is not first and sched.counts["plans"] == 2 and sched.counts["stand_ins"] == 1
    assert sched.plan(1, 0, common=-2) is far and sched.counts["stand_ins"] == 2   # the nearest serves
    holder["snapshot"] = snapshot({("a", "t"): 0.5, ("b", "t"): 0.75, ("a", "b"): 0.8})
    clock.now += 0.3   # stale, and the share still past the budget: it stands
    assert sched.planner.inline_share(clock.now) > sched.settings.inline_planning_share
    assert sched.plan(1, 0) is first and sched.counts["plans"] == 2
    clock.now += 2.0   # the share has faded: the new shift is planned
    assert sched.planner.inline_share(clock.now) < sched.settings.inline_planning_share
    shifted = sched.plan(1, 0, common=3)
    assert shifted is not first and sched.counts["plans"] == 3 and sched.counts["stand_ins"] == 2
    # past the budget again, but the stale plan, of a replaced snapshot and older than plan_max_age_s, may
    # serve no longer: it is remade (a plan of the first requests' snapshot stood for a run of another text)
    assert sched.planner.inline_share(clock.now) > sched.settings.inline_planning_share
    remade = sched.plan(1, 0)
    assert remade is not first and remade.version > first.version and sched.counts["plans"] == 4
    # with the budget at 1 (every plan made whatever it costs) nothing stands in
    sched.settings.inline_planning_share = 1.0
    assert sched.plan(1, 0, common=-5) is not remade and sched.counts["stand_ins"] == 2
