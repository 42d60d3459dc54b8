"""The scheduler's decisions from a controlled snapshot: least T_eff, calibration, exploration, hysteresis."""

from __future__ import annotations

import math
import os
import random
import sys
import threading
import time
from dataclasses import astuple

import pytest

from specrouter.pool.similarity import PairSimilarity
from specrouter.profiler.metrics import Mode
from specrouter.router.chain import TARGET_ONLY_BLOCK, Row
from specrouter.router.measurements import snapshot_from_pb
from specrouter.router.scheduling.plans import PlanKey
from specrouter.router.scheduling.acceptance import AcceptanceEstimates, Calibration, RecentReports
from specrouter.router.scheduling.candidates import candidate_chains, chain_pairs
from specrouter.router.scheduling.ledger import Tally
from specrouter.router.scheduling.scheduler import Scheduler
from specrouter.router.scheduling.settings import SchedulerSettings
from specrouter.v1 import profiler_pb2 as ppb
from specrouter.worker.calls import SamplingParams

GREEDY = ppb.DECODING_MODE_GREEDY
MS = 1e6
DECODE_MS = {"a": 1.0, "b": 2.5, "t": 10.0}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBatch:
    """What the scheduler reads of a ChainBatch: its rows."""

    def __init__(self, rows: int, greedy: bool = True):
        params = SamplingParams() if greedy else SamplingParams(temperature=1.0, seed=1)
        self.rows = {str(i): Row(str(i), [1, 2, 3], 3, params, 64) for i in range(rows)}
        for r in self.rows.values():
            r.seen = {m: 2 for m in DECODE_MS}


def snapshot_pb(acceptance: dict[tuple[str, str], float], checks: int = 10_000, depth: int = 9,
                samples: int = 100) -> ppb.SnapshotResponse:
    s = ppb.SnapshotResponse(ema_alpha=0.1, acceptance_alpha=0.01)
    for model, ms in DECODE_MS.items():
        for b in (1, 2, 3, 4, 8, 16):
            for k in range(1, 11):
                s.forward.add(model=model, batch_size_bucket=b, tokens_per_row_bucket=k,
                              ema_forward_ns=ms * MS * (1 + 0.02 * b * k), samples=10)
    for (d, v), rate in acceptance.items():
        for position in range(depth):
            s.acceptance.add(drafter=d, verifier=v, mode=GREEDY, position=position, ema_acceptance_rate=rate,
                             accepted_total=int(rate * checks), proposed_total=checks, samples=samples)
    return s


def snapshot(acceptance: dict[tuple[str, str], float], **kwargs):
    """The profiler's reply as the scheduler reads it (decoded at the router's edge)."""
    return snapshot_from_pb(snapshot_pb(acceptance, **kwargs))


def make(acceptance, clock=None, **settings) -> tuple[Scheduler, dict]:
    holder = {"snapshot": snapshot(acceptance)}
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(**settings), lambda: holder["snapshot"],
                      clock=clock or Clock())
    return sched, holder


def test_candidates_are_every_chain_ending_at_the_target() -> None:
    chains = candidate_chains(["a", "b", "t"], "t", max_levels=4)
    assert chains == [("t",), ("a", "t"), ("b", "t"), ("a", "b", "t"), ("b", "a", "t")]
    assert candidate_chains(["a", "b", "t"], "t", max_levels=2) == [("t",), ("a", "t"), ("b", "t")]


def test_high_acceptance_picks_the_cheap_drafter_and_a_long_window() -> None:
    sched, _ = make({("a", "t"): 0.95, ("b", "t"): 0.95, ("a", "b"): 0.95, ("b", "a"): 0.95},
                    explore_after_s=1e9)
    chain, window = sched.choose(FakeBatch(1))
    assert chain == ("a", "t") and window >= 6
    plan = sched.plan(1, 0)
    assert plan.predictions[0].t_eff_ns <= min(p.t_eff_ns for p in plan.predictions)
    assert {(p.chain, p.window) for p in plan.predictions} >= {(("t",), 0), (("b", "a", "t"), 8)}


def test_low_acceptance_picks_target_only() -> None:
    sched, _ = make({pair: 0.05 for pair in [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]}, explore_after_s=1e9)
    assert sched.choose(FakeBatch(4)) == (("t",), 0)


def test_decision_follows_the_metrics_with_hysteresis() -> None:
    clock = Clock()
    sched, holder = make({("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}, clock,
                         explore_after_s=1e9, recompute_s=0.0)
    batch = FakeBatch(1)
    first = sched.choose(batch)
    assert first[0] == ("a", "t")
    # the same prediction, slightly better elsewhere (within hysteresis): the batch keeps its choice
    assert sched.choose(batch) == first
    # acceptance collapses: the plan is refreshed and the batch switches to plain decoding
    holder["snapshot"] = snapshot({("a", "t"): 0.02, ("b", "t"): 0.02, ("a", "b"): 0.02, ("b", "a"): 0.02})
    clock.now += 1
    assert sched.choose(batch) == (("t",), 0)
    assert sched.counts["switches"] == 1


def test_hysteresis_keeps_a_choice_that_is_nearly_as_good() -> None:
    sched, _ = make({("a", "t"): 0.8, ("b", "t"): 0.5, ("a", "b"): 0.5, ("b", "a"): 0.5}, explore_after_s=1e9,
                    hysteresis=0.5, chain_hysteresis=0.5)
    batch = FakeBatch(1)
    plan = sched.plan(1, 0)
    second = next(p for p in plan.predictions[1:] if p.t_eff_ns < plan.predictions[0].t_eff_ns * 1.5)
    _standing(sched, batch, second)
    assert sched.choose(batch) == (second.chain, second.window)


def _standing(sched: Scheduler, batch, prediction) -> None:
    from specrouter.router.scheduling.policy import Decision
    sched.state(batch).current = Decision(prediction.chain, prediction.window, prediction)


def test_a_chain_switch_needs_more_than_a_window_change() -> None:
    acceptance = {("a", "t"): 0.8, ("b", "t"): 0.8, ("a", "b"): 0.5, ("b", "a"): 0.5}
    probe, _ = make(acceptance, explore_after_s=1e9)
    plan = probe.plan(1, 0)
    best = plan.predictions[0]
    in_b = sorted((p for p in plan.predictions if p.chain == ("b", "t")), key=lambda p: p.t_eff_ns)
    gain = 1 - best.t_eff_ns / in_b[0].t_eff_ns      # how much faster (a, t) is than (b, t) at its best
    assert best.chain == ("a", "t") and 0.05 < gain < 0.9
    for chain_hysteresis, expected in ((gain + 0.02, ("b", "t")), (gain - 0.02, ("a", "t"))):
        sched, _ = make(acceptance, explore_after_s=1e9, chain_hysteresis=chain_hysteresis)
        batch = FakeBatch(1)
        _standing(sched, batch, in_b[-1])            # (b, t) at its worst window
        chain, window = sched.choose(batch)
        assert chain == expected
        if chain == ("b", "t"):                       # kept the chain, moved to its best window
            assert window == in_b[0].window
    # a window change within the chain still happens at the (small) window hysteresis
    sched, _ = make(acceptance, explore_after_s=1e9, chain_hysteresis=0.99)
    batch = FakeBatch(1)
    worse = next(p for p in in_b if p.t_eff_ns * (1 - sched.settings.hysteresis) > in_b[0].t_eff_ns)
    _standing(sched, batch, worse)
    assert sched.choose(batch) == (("b", "t"), in_b[0].window)


def test_a_switch_near_the_end_of_the_batch_does_not_pay_for_its_catch_up() -> None:
    acceptance = {("a", "t"): 0.6, ("b", "t"): 0.9, ("a", "b"): 0.5, ("b", "a"): 0.5}
    decisions = {}
    for left in (60, 3):
        sched, _ = make(acceptance, explore_after_s=1e9, chain_hysteresis=0.0, hysteresis=0.0)
        batch = FakeBatch(1)
        row = next(iter(batch.rows.values()))
        row.max_new_tokens = 300
        row.tokens += [7] * (300 - left)              # `left` tokens to go; (b) has seen none of the output
        row.seen = {"a": len(row.tokens) - 1, "t": len(row.tokens) - 1, "b": 2}
        plan = sched.plan(1, 0)
        assert plan.predictions[0].chain == ("b", "t")
        _standing(sched, batch, next(p for p in plan.predictions if p.chain == ("a", "t")))
        decisions[left] = sched.choose(batch)[0]
    # with many cycles to go the catch-up is spread thin: switch; with a cycle or two left it is not worth it
    assert decisions == {60: ("b", "t"), 3: ("a", "t")}


def test_unmeasured_pairs_are_explored_then_left_alone() -> None:
    clock = Clock()
    sched, _ = make({("a", "t"): 0.9}, clock, explore_after_s=5.0, explore_every_cycles=10)
    batch = FakeBatch(1)
    decisions = [sched.choose(batch) for _ in range(40)]
    explored = {c for c, _ in decisions if c != ("a", "t")}
    # the three pairs never measured, (b, t), (a, b) and (b, a), each got a cycle of a chain holding them
    assert sched.counts["explorations"] == 3
    assert ("b", "a", "t") in explored and any("b" in c for c in explored)
    gaps = [i for i, (c, _) in enumerate(decisions) if c != ("a", "t")]
    assert all(later - earlier >= 10 for earlier, later in zip(gaps, gaps[1:]))


def test_an_exploration_waits_for_a_batch_without_catch_up() -> None:
    """An overdue pair is explored in a batch whose rows its chain's models have all seen (a new request),
    not in one where a model that sat out must first feed the tokens it missed; past `explore_patience`
    times overdue it is explored anyway."""
    clock = Clock()
    sched, _ = make({("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.9, ("b", "a"): 0.9}, clock,
                    explore_after_s=5.0, explore_gap=0.0, explore_every_cycles=1, explore_patience=2.0)
    running = FakeBatch(1)
    row = next(iter(running.rows.values()))
    for pair in sched.pairs:      # every pair measured now
        sched.freshness.mark((*pair, Mode.GREEDY), clock.now)
    assert sched.choose(running)[0] == ("a", "t")
    row.tokens += list(range(4, 44))   # 40 tokens on, drafted by a: b has not seen them
    row.seen = {"a": len(row.tokens) - 1, "t": len(row.tokens) - 1, "b": 2}
    clock.now += 6.0               # every pair but (a, t) overdue, none twice over
    sched.freshness.mark(("a", "t", Mode.GREEDY), clock.now)   # the standing chain's cycles measure it
    assert sched.choose(running)[0] == ("a", "t")
    assert sched.counts["explorations"] == 0
    fresh = FakeBatch(1)           # a new request: every model prefilled it
    assert "b" in sched.choose(fresh)[0]
    assert sched.counts["explorations"] == 1
    clock.now += 6.0               # the others now twice overdue: explored even with the catch-up
    sched.freshness.mark(("a", "t", Mode.GREEDY), clock.now)
    assert "b" in sched.choose(running)[0]
    assert sched.counts["explorations"] == 2


def test_pairs_far_behind_are_explored_less_often() -> None:
    """Every pair measured at the start; then a pair waits explore_after_s times its best chain's
    predicted gap over explore_gap before it is explored again, and the closest competitor goes first."""
    acceptance = {("a", "t"): 0.9, ("b", "t"): 0.9, ("a", "b"): 0.3, ("b", "a"): 0.3}
    clock = Clock()
    sched, _ = make(acceptance, clock, explore_after_s=5.0, explore_every_cycles=1, explore_gap=0.1,
                    explore_after_max_s=30.0)
    batch = FakeBatch(1)
    plan = sched.plan(1, 0)
    best = plan.predictions[0].t_eff_ns
    gap = {pair: next(p.t_eff_ns for p in plan.predictions if pair in chain_pairs(p.chain)) / best - 1
           for pair in acceptance}
    assert gap[("a", "t")] == 0 and 0.1 < gap[("b", "t")] < min(gap[("a", "b")], gap[("b", "a")])
    due = {pair: min(30.0, 5.0 * max(1.0, g / 0.1)) for pair, g in gap.items()}
    assert due[("b", "t")] < due[("a", "b")] == due[("b", "a")] == 30.0      # both three-level chains are far off
    first: dict[tuple[str, str], float] = {}
    start = clock.now
    for _ in range(80):                       # a cycle every half second, 40 seconds
        chain, _ = sched.choose(batch)
        for pair in chain_pairs(chain):
            if sched.counts["explorations"] and pair not in first and chain != ("a", "t"):
                first[pair] = clock.now - start
        clock.now += 0.5
    assert set(first) >= {("b", "t"), ("a", "b")}
    assert due[("b", "t")] <= first[("b", "t")] < due[("b", "t")] + 1.0
    assert due[("a", "b")] <= first[("a", "b")] < due[("a", "b")] + 2.0
    # without the scaling every pair is due after explore_after_s
    flat, _ = make(acceptance, Clock(), explore_after_s=5.0, explore_gap=0.0)
    assert {flat.policy.exploration_wait(plan, pair) for pair in acceptance} == {5.0}


def test_calibration_never_falls_with_similarity() -> None:
    """Pairs can fit a falling line; least squares under slope >= 0 is then the flat line through their
    weighted mean, so no pair is predicted better for being less similar."""
    points = [(0.3, 0.85, 256.0), (0.5, 0.80, 256.0), (0.7, 0.70, 256.0), (0.9, 0.66, 256.0)]
    line = Calibration.fit(points)
    mean = sum(y * w for _, y, w in points) / sum(w for *_, w in points)
    assert line.slope == 0.0 and line(0.1) == line(0.9) == pytest.approx(mean)
    mirrored = Calibration.fit([(1.2 - x, y, w) for x, y, w in points])     # the same points, rising
    assert 0.3 < mirrored.slope < 1.0 and mirrored(1.2 - 0.3) == pytest.approx(0.85, abs=0.03)


def test_a_lightly_measured_pair_does_not_tilt_the_calibration() -> None:
    """Two pairs 0.037 apart in similarity, the second seen in one lucky cycle: least squares alone fits
    slope 5.8 and puts a slightly more similar pair at acceptance 1; shrunk towards slope 1, the line
    moves the prior by the similarity difference and little more."""
    points = [(0.720, 0.79, 256.0), (0.757, 1.0, 5.0)]
    line = Calibration.fit(points)
    assert line.slope == pytest.approx(1.0, abs=0.05)
    assert line(0.763) == pytest.approx(0.79 + (0.763 - 0.720), abs=0.01)
    # pairs alike in similarity that disagree set the level, not a slope of their own
    alike = Calibration.fit([(0.72, 0.70, 256.0), (0.74, 0.90, 256.0)])
    assert alike.slope < 2.0 and alike(0.80) < 0.95


def test_calibration_recovers_a_line_and_starts_as_the_identity() -> None:
    assert Calibration.fit([])(0.7) == pytest.approx(0.7)
    assert Calibration.fit([(0.5, 0.6, 1.0)])(0.7) == pytest.approx(0.8)
    # pairs of full weight spread over similarity: their own slope, nudged towards 1 by the prior
    line = Calibration.fit([(x, 0.1 + 0.8 * x, 256.0) for x in (0.2, 0.5, 0.9)])
    assert line.slope == pytest.approx(0.8, abs=0.02) and line(0.5) == pytest.approx(0.5, abs=0.01)
    assert line(2.0) == 1.0 and line(-1.0) == 0.0


def test_prior_of_an_unobserved_pair_comes_from_calibrated_similarity() -> None:
    offline = [PairSimilarity("a", "t", "greedy", 0.6, 100), PairSimilarity("b", "t", "greedy", 0.8, 100),
               PairSimilarity("a", "b", "greedy", 0.7, 100)]
    # observed: acceptance = similarity + 0.1 on both pairs
    est = AcceptanceEstimates(snapshot({("a", "t"): 0.7, ("b", "t"): 0.9}), offline, prior_weight=16)
    assert est.prior(("a", "b", Mode.GREEDY)) == pytest.approx(0.8)
    assert est.rates(("a", "b", Mode.GREEDY), 3) == pytest.approx([0.8] * 3)
    assert est.prior(("b", "a", Mode.GREEDY)) == 0.5   # no similarity at all: the default
    # an observed pair uses its measurements, shrunk by prior_weight pseudo-checks (towards the default
    # here: without similarities there is no calibration)
    # (acceptance_alpha 0.01: about 199 checks remembered; a report of 16 checks weighs 16)
    few = AcceptanceEstimates(snapshot({("a", "t"): 0.2}, checks=16, depth=1, samples=1), (), prior_weight=16,
                              default_acceptance=0.5)
    pooled = (16 * 0.2 + 16 * 0.5) / 32
    assert few.rates(("a", "t", Mode.GREEDY), 2) == pytest.approx([(16 * 0.2 + 16 * pooled) / 32] * 2)
    # 10,000 checks, in reports of one check or of a hundred: the EMA remembers about 199 of them
    for reports in (10_000, 100):
        many = AcceptanceEstimates(snapshot({("a", "t"): 0.2}, checks=10_000, depth=1, samples=reports), (),
                                   prior_weight=16, default_acceptance=0.5)
        assert many.observed[("a", "t", Mode.GREEDY)][0].checks == pytest.approx(199.0)


def test_a_deep_position_measured_a_little_leans_on_the_one_before_it() -> None:
    """Rates falling with depth (prose): position 0 at 0.9, positions 1-3 at 0.5 (well measured), position
    4 at 0.4 over 16 checks. Position 4 is shrunk towards position 3's estimate, not towards the pooled
    rate that position 0 lifts, and positions beyond it take its estimate."""
    s = ppb.SnapshotResponse(ema_alpha=0.1, acceptance_alpha=0.01)
    for position, (rate, checks) in enumerate([(0.9, 10_000), (0.5, 10_000), (0.5, 10_000), (0.5, 10_000), (0.4, 16)]):
        s.acceptance.add(drafter="a", verifier="t", mode=GREEDY, position=position, ema_acceptance_rate=rate,
                         accepted_total=round(rate * checks), proposed_total=checks, samples=100)
    est = AcceptanceEstimates(snapshot_from_pb(s), prior_weight=16.0)
    rates = est.rates(("a", "t", Mode.GREEDY), 7)
    assert rates[3] == pytest.approx(0.5, abs=0.01)
    assert rates[4] == pytest.approx((16 * 0.4 + 16 * rates[3]) / 32)    # half way to its neighbour: 0.45
    assert rates[5] == rates[6] == rates[4]
    assert rates[0] > 0.85


def _pairs_snapshot(pairs: dict[tuple[str, str], tuple[float, int]]):
    """(drafter, verifier) -> (rate, reports) at position 0, one check a report."""
    s = ppb.SnapshotResponse(ema_alpha=0.1, acceptance_alpha=0.01)
    for (d, v), (rate, reports) in pairs.items():
        s.acceptance.add(drafter=d, verifier=v, mode=GREEDY, position=0, ema_acceptance_rate=rate,
                         accepted_total=round(rate * reports), proposed_total=reports, samples=reports)
    return snapshot_from_pb(s)


def test_a_pair_the_pool_stopped_running_falls_back_to_its_prior() -> None:
    """Both pairs ran on easy text (0.9); then the pool ran 500 cycles of a -> t alone on hard text
    (0.6). b -> t, as alike to t as a is, still holds 0.9 in the profiler; it falls back to the prior
    the calibration draws from a -> t's current rate. Nothing running fades nothing."""
    offline = [PairSimilarity("a", "t", "greedy", 0.7, 100), PairSimilarity("b", "t", "greedy", 0.7, 100)]
    before = _pairs_snapshot({("a", "t"): (0.9, 400), ("b", "t"): (0.9, 400)})
    after = _pairs_snapshot({("a", "t"): (0.6, 900), ("b", "t"): (0.9, 400)})
    recent = RecentReports(cycles=50)
    recent.update(before)
    assert recent.shares()[(("b", "t", Mode.GREEDY), 0)] == 1.0
    recent.update(after)
    shares = recent.shares()
    assert shares[(("a", "t", Mode.GREEDY), 0)] == 1.0
    faded = 400 * math.exp(-500 / 50)   # b's reports, 500 reports of the pool later
    assert shares[(("b", "t", Mode.GREEDY), 0)] == pytest.approx(faded / (faded + 500))
    est = AcceptanceEstimates(after, offline, prior_weight=16, recent=shares)
    assert est.rates(("b", "t", Mode.GREEDY), 1) == pytest.approx([0.6], abs=0.005)
    assert est.rates(("a", "t", Mode.GREEDY), 1) == pytest.approx([0.6], abs=0.005)
    # the same snapshot without the pool's recent history: b -> t keeps its old rate
    lone = AcceptanceEstimates(after, offline, prior_weight=16)
    assert lone.rates(("b", "t", Mode.GREEDY), 1) == pytest.approx([0.9], abs=0.02)
    # the pool idle: the same totals again fade nothing
    recent.update(after)
    assert recent.shares() == pytest.approx(shares)


def test_deeper_positions_take_the_deepest_measured_rate() -> None:
    est = AcceptanceEstimates(snapshot({("a", "t"): 0.9}, depth=2), prior_weight=0)
    assert est.rates(("a", "t", Mode.GREEDY), 5) == pytest.approx([0.9] * 5)
    # acceptance rising with depth: unmeasured positions follow the deepest, not the pooled rate
    rising = snapshot_pb({("a", "t"): 0.6}, depth=1)
    rising.acceptance.add(drafter="a", verifier="t", mode=GREEDY, position=1, ema_acceptance_rate=0.9,
                          accepted_total=9000, proposed_total=10_000, samples=100)
    est = AcceptanceEstimates(snapshot_from_pb(rising), prior_weight=0)
    assert est.rates(("a", "t", Mode.GREEDY), 4) == pytest.approx([0.6, 0.9, 0.9, 0.9])


def test_decisions_are_cheap_once_planned() -> None:
    sched, _ = make({("a", "t"): 0.9}, explore_every_cycles=10**9, recompute_s=1e9)
    batch = FakeBatch(4)
    sched.choose(batch)
    plans = sched.counts["plans"]
    for _ in range(200):
        sched.choose(batch)
    assert sched.counts["plans"] == plans          # no re-planning on the decision path
    assert sched.decision_ns.get() < 1e6           # well under a millisecond per decision


def test_a_named_chain_gets_its_own_best_window() -> None:
    sched, _ = make({("a", "t"): 0.95, ("b", "t"): 0.3, ("a", "b"): 0.5, ("b", "a"): 0.5}, explore_every_cycles=1,
                    explore_after_s=0.0)
    plan = sched.plan(1, 0)
    assert plan.predictions[0].chain == ("a", "t")
    best_b = min((p for p in plan.predictions if p.chain == ("b", "t")), key=lambda p: p.t_eff_ns)
    batch = FakeBatch(1)
    # never another chain, never an exploration, whatever the exploration settings
    assert [sched.choose(batch, ("b", "t")) for _ in range(5)] == [(("b", "t"), best_b.window)] * 5
    assert best_b.window < plan.predictions[0].window   # poor acceptance: a shorter window than (a, t)'s
    assert sched.counts["explorations"] == 0
    # a named window: the best chain at that window (or the target alone, which has none)
    at_2 = min((p for p in plan.predictions if p.window == 2 or p.chain == ("t",)), key=lambda p: p.t_eff_ns)
    assert sched.choose(FakeBatch(1), None, 2) == (at_2.chain, at_2.window) == (("a", "t"), 2)
    # a chain longer than the scheduler plans (max_levels 2 here) still runs, at the middle window
    short, _ = make({("a", "t"): 0.9}, max_levels=2, windows=[1, 2, 3, 4, 5])
    assert short.choose(FakeBatch(1), ("a", "b", "t")) == (("a", "b", "t"), 3)


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
        time.sleep(0.05)                  # the planner waits for its round
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
        time.sleep(0.05)                  # the planner waits for its round
        assert sched.plan(1, 0, common=-4) is unshifted     # the stand-in
        assert sched.counts["stand_ins"] == 1
        for _ in range(500):
            if (1, 0, -4, 0, None) in sched.planner.plans:
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

    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(explore_after_s=1e9, recompute_s=0.01), flaky,
                      clock=clock)
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
    from specrouter.router.chain import CycleReport

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
    from specrouter.router.chain import CycleReport
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


def test_no_draft_is_longer_than_the_tokens_left() -> None:
    acceptance = {("a", "t"): 0.95, ("b", "t"): 0.95, ("a", "b"): 0.95, ("b", "a"): 0.95}
    sched, _ = make(acceptance, explore_after_s=1e9)
    batch = FakeBatch(2)
    chain, window = sched.choose(batch)
    assert chain == ("a", "t") and window >= 6        # plenty of tokens to go: a long window
    rows = list(batch.rows.values())
    rows[0].tokens += [7] * (rows[0].max_new_tokens - 3)   # 3 tokens left; the other row still has 64
    assert sched.choose(batch) == (chain, window)      # the batch runs as long as its longest row
    rows[1].tokens += [7] * (rows[1].max_new_tokens - 4)   # now 3 and 4 left: at most 4 can be emitted
    chain, window = sched.choose(batch)
    assert chain == ("a", "t") and window == 3
    # one token left: a draft cannot add to it, the target alone emits it
    for r in rows:
        r.tokens += [7] * (r.max_new_tokens - 1 - len(r.generated))
    assert sched.choose(batch) == (("t",), 0)
    # ... or, the chain being named, its cheapest cycle
    assert sched.choose(batch, ("b", "t")) == (("b", "t"), 1)
    # a named window is the requests' to name, even when it outlasts what is left
    named = FakeBatch(1)
    row = next(iter(named.rows.values()))
    row.tokens += [7] * (row.max_new_tokens - 2)
    assert sched.choose(named, None, 8) == (("a", "t"), 8)


def test_a_batch_drafts_no_longer_than_its_window_cap_unless_named() -> None:
    """Rows of a batch differ for good, which the tail factor does not see: a batch of two rows or more
    drafts at most `batch_max_window` tokens, even where a longer window is predicted faster; one row is
    not capped, and a window the requests named is theirs."""
    acceptance = {("a", "t"): 0.97, ("b", "t"): 0.97, ("a", "b"): 0.97, ("b", "a"): 0.97}
    uncapped, _ = make(acceptance, explore_after_s=1e9, batch_max_window=8)
    assert uncapped.choose(FakeBatch(4)) == (("a", "t"), 8)      # predicted best for 4 rows
    sched, _ = make(acceptance, explore_after_s=1e9)
    assert sched.settings.batch_max_window == 6
    assert sched.choose(FakeBatch(1)) == (("a", "t"), 8)
    assert sched.choose(FakeBatch(4)) == (("a", "t"), 6)
    assert sched.choose(FakeBatch(4), None, 8) == (("a", "t"), 8)


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
    """A one-row plan carries its finish costs (made with the plan, off the cycle's path), at the latency
    table's times; a batch whose passes all run twice as slow scores every candidate twice as high, at
    every number of tokens left, so it decides alike."""
    sched, _ = make({("a", "t"): 0.7, ("b", "t"): 0.7, ("a", "b"): 0.5, ("b", "a"): 0.5}, explore_after_s=1e9)
    from specrouter.router.scheduling.scoring import finish_score

    plan = sched.plan(1, 0)
    assert plan.finish is not None and sched.plan(4, 0).finish is None
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


def test_a_batch_is_planned_with_the_forward_times_of_its_context_length() -> None:
    """Passes over these rows' context cost the target twice what the profiler's table says: once enough
    cycles measured it, a batch of that context length has its target level scaled by it, its drafter's
    level not (as the table says), and a batch of another context length nothing."""
    from specrouter.router.chain import CycleReport
    from specrouter.worker.calls import ForwardTiming, StepResult

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
    from specrouter.router.chain import CycleReport
    from specrouter.worker.calls import ForwardTiming, StepResult

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
    (key,) = [k for k in sched.planner.plans if k.shift != 0 and k.greedy == 2]   # (the one-row plan is shifted too)
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
    assert key.shift < 0 and key.pairs is None
    for p in shifted_plan.predictions:
        before = base.by_key[(p.chain, p.window)]
        if len(p.chain) == 1:
            assert p.emitted == before.emitted == TARGET_ONLY_BLOCK
        else:
            assert p.emitted < before.emitted


def _prompt_cycle(chain: tuple[str, ...], rows: list[Row], proposed: int = 2):
    from specrouter.router.chain import CycleReport

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


def test_a_model_the_batch_lost_is_never_chosen_nor_explored() -> None:
    """A batch whose drafter failed has the chains without it only: the best of those, and explorations
    among them, while another batch still gets the best chain of the pool."""
    sched, _ = make({("a", "t"): 0.95, ("b", "t"): 0.7, ("a", "b"): 0.9, ("b", "a"): 0.9},
                    explore_after_s=0.0, explore_every_cycles=1)
    whole, lost = FakeBatch(1), FakeBatch(1)
    lost.workers = {"b": None, "t": None}   # "a" dropped
    chosen = {sched.choose(lost)[0] for _ in range(30)}
    assert chosen and all(set(c) <= {"b", "t"} for c in chosen), chosen
    assert sched.counts["explorations"] > 0
    assert {sched.choose(whole)[0] for _ in range(30)} & {("a", "t"), ("a", "b", "t"), ("b", "a", "t")}


def test_a_batch_of_greedy_and_sampled_rows_is_explored() -> None:
    """Overdue pairs of a mixed batch tie across modes (both unmeasured); ranking them must compare how
    overdue they are alone, not the modes (which have no order)."""
    sched, _ = make({("a", "t"): 0.9}, explore_after_s=0.0, explore_every_cycles=1)
    batch, sampled = FakeBatch(2), FakeBatch(2, greedy=False)
    for row in sampled.rows.values():
        row.row_id = f"sampled-{row.row_id}"
        batch.rows[row.row_id] = row
    chains = [sched.choose(batch)[0] for _ in range(8)]
    assert sched.counts["explorations"] >= 3
    assert any("b" in c for c in chains)


def test_a_lone_rows_drafts_that_look_ahead_price_its_longer_windows_lower() -> None:
    from specrouter.router.chain import CycleReport
    from specrouter.router.scheduling.draft_passes import draft_scale
    from specrouter.worker.calls import ForwardTiming, StepResult

    sched, _ = make({("a", "t"): 0.7}, explore_after_s=1e9)
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
    after = sched.planner.make(1, 0)
    for window in (3, 6):
        was, now = before.by_key[(("a", "t"), window)], after.by_key[(("a", "t"), window)]
        saved = (1 - known[("a", window)]) * (window - 1) * single
        assert was.level_ns[0] - now.level_ns[0] == pytest.approx(saved, rel=1e-6)


def test_coupled_rows_are_planned_on_the_coupled_acceptance_of_their_pairs() -> None:
    """Coupled sampling accepts a token iff two picks agree, not with min(1, p/q): its rates are measured and
    planned apart. With (a, t) accepting 0.95 coupled and 0.05 under speculative sampling, a coupled row
    drafts with a, a sampled one decodes with the target alone."""
    pairs = [("a", "t"), ("b", "t"), ("a", "b"), ("b", "a")]
    reply = snapshot_pb({})
    for (d, v) in pairs:
        for mode, rate in ((ppb.DECODING_MODE_COUPLED, 0.95), (ppb.DECODING_MODE_SAMPLING, 0.05)):
            for position in range(9):
                reply.acceptance.add(drafter=d, verifier=v, mode=mode, position=position, ema_acceptance_rate=rate,
                                     accepted_total=int(rate * 10_000), proposed_total=10_000, samples=100)
    holder = {"snapshot": snapshot_from_pb(reply)}
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(explore_after_s=1e9), lambda: holder["snapshot"],
                      clock=Clock())
    coupled, sampled = FakeBatch(1, greedy=False), FakeBatch(1, greedy=False)
    for r in coupled.rows.values():
        r.sampling = SamplingParams(temperature=1.0, seed=1, coupled=True)
    assert sched.choose(coupled)[0] == ("a", "t")
    assert sched.choose(sampled)[0] == ("t",)
    assert sched.plan(0, 0, coupled_rows=1).predictions[0].chain == ("a", "t")
