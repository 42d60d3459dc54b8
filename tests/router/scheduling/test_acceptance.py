"""Acceptance estimates: the calibrated prior, the rates per draft position and per mode, the pool's recent reports."""

from __future__ import annotations

import math

import pytest

from specrouter.pool.similarity import PairSimilarity
from specrouter.contract.measures import Mode
from specrouter.router.measurements import snapshot_from_pb
from specrouter.router.scheduling.acceptance import (CALIBRATION_PRIOR_CHECKS, AcceptanceEstimates, Calibration,
                                                     RecentReports)
from specrouter.router.scheduling.scheduler import Scheduler
from specrouter.router.scheduling.settings import SchedulerSettings
from specrouter.v1 import profiler_pb2 as ppb
from specrouter.contract.calls import SamplingParams
from tests.router.scheduling.fakes import DECODE_MS, GREEDY, Clock, FakeBatch, snapshot, snapshot_pb


def test_calibration_never_falls_with_similarity() -> None:
    """Pairs can fit a falling line; least squares under slope >= 0 is then the flat line through their
    weighted mean, so no pair is predicted better for being less similar."""
    points = [(0.3, 0.85, 256.0), (0.5, 0.80, 256.0), (0.7, 0.70, 256.0), (0.9, 0.66, 256.0)]
    line = Calibration.fit(points)
    weight = sum(w for *_, w in points)
    mean_x = sum(x * w for x, _, w in points) / weight   # the identity's level there, by its pseudo-checks
    mean = (sum(y * w for _, y, w in points) + CALIBRATION_PRIOR_CHECKS * mean_x) / (weight + CALIBRATION_PRIOR_CHECKS)
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
    # one pair: the identity shifted towards it by its weight against CALIBRATION_PRIOR_CHECKS
    pulled = 0.1 * 256 / (256 + CALIBRATION_PRIOR_CHECKS)
    assert Calibration.fit([(0.5, 0.6, 256.0)])(0.7) == pytest.approx(0.7 + pulled)
    # the first request's few drafts, all accepted, a tenth of a check in the pool's recent reports: not
    # every pair at acceptance 1
    assert Calibration.fit([(0.6, 1.0, 0.1)])(0.6) == pytest.approx(0.6, abs=0.005)
    # pairs of full weight spread over similarity: their own slope, nudged towards 1 by the prior
    line = Calibration.fit([(x, 0.1 + 0.8 * x, 256.0) for x in (0.2, 0.5, 0.9)])
    assert line.slope == pytest.approx(0.8, abs=0.02) and line(0.5) == pytest.approx(0.5, abs=0.01)
    assert line(2.0) == 1.0 and line(-1.0) == 0.0


def test_prior_of_an_unobserved_pair_comes_from_calibrated_similarity() -> None:
    offline = [PairSimilarity("a", "t", "greedy", 0.6, 100), PairSimilarity("b", "t", "greedy", 0.8, 100),
               PairSimilarity("a", "b", "greedy", 0.7, 100)]
    # observed: acceptance = similarity + 0.1 on both pairs
    est = AcceptanceEstimates(snapshot({("a", "t"): 0.7, ("b", "t"): 0.9}), offline, prior_weight=16)
    # (the calibration's level a little towards the identity: CALIBRATION_PRIOR_CHECKS against ~400)
    assert est.prior(("a", "b", Mode.GREEDY)) == pytest.approx(0.8, abs=0.005)
    assert est.rates(("a", "b", Mode.GREEDY), 3) == pytest.approx([est.prior(("a", "b", Mode.GREEDY))] * 3)
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
    assert est.rates(("b", "t", Mode.GREEDY), 1) == pytest.approx([0.6], abs=0.01)
    assert est.rates(("a", "t", Mode.GREEDY), 1) == pytest.approx([0.6], abs=0.01)
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
