"""Acceptance estimates: each pair's acceptance per draft position, from the profiler's snapshot and a
calibrated prior.

Acceptance of an ordered pair (drafter, verifier) in a decoding mode, per draft position i, is the
profiler's EMA of the realized rate, shrunk by `prior_weight` pseudo-checks: position 0 towards the
pair's rate pooled over its positions (itself shrunk towards the pair's prior), each deeper position
towards the estimate of the one before it. Rates move with depth, and which way depends on the text
(falling on prose, rising on repetitive tables), so a deep position measured a little is best guessed
from its neighbour; shrunk towards the pooled rate, which position 0 dominates, deep positions come out
too high on prose and too low on tables, and both make the middle windows look best. The counts are
effective ones: the EMA remembers about (2 - alpha) / alpha checks (alpha: the profiler's
`acceptance_alpha`), so a position weighs that many, never more than its checks, times its share of
the pool's recent reports (`RecentReports`: its reports over the most reported pair's, both decayed
over the last cycles of the pool). A deep position, reached in a fraction of the cycles, last moved
that much longer ago; and a pair the batches stopped running keeps, in the profiler, the rate of the
text it ran on last: when the text changes, the pairs still running show it and that one does not
(after a switch from repetitive text to prose, a pair that kept its repetitive rates would be picked
and run for whole requests at long windows, emitting far fewer tokens a cycle than predicted). Its
weight fades as the pool runs on without it, so its estimate falls back to its prior, which the
calibration ties to the pairs measured now. Deep positions are checked rarely; this keeps an
easy stretch long gone from making a long window look good. Positions deeper than any measured take the
deepest one's estimate (greedy acceptance tends to rise with depth, so the pooled rate, dominated by
position 0, would keep windows from growing); a pair never measured takes its prior at every position.
The lookup level's checks are also kept per length of the match it copied from (`lookup.by_match`), each
such pair shrunk towards the lookup's estimate over every match.

The prior of a pair comes from its similarity (1 - E[TV] between the two models' rows) through a
calibration, a least-squares line from similarity to realized acceptance fitted over the pairs already
observed in that mode (the identity until one is; its slope shrunk towards 1, so that pairs alike in
similarity set its level, not its tilt; never falling: flat where the data say it falls).
The similarity of a pair is the one measured offline for the pool when there is one (it exists for every
pair, observed or not), else the live one from verification. Coupled sampling has no offline similarity of
its own: a coupled pair takes its pair's 1 - TV under sampling, and the coupled mode's own calibration maps
that to the agreement of the coupled picks it realizes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from specrouter.pool.similarity import PairSimilarity
from specrouter.contract.measures import EmaConstants, Mode
from specrouter.router.lookup import level_of
from specrouter.router.scheduling.candidates import Pair
from specrouter.router.scheduling.snapshot import Snapshot

CALIBRATION_WEIGHT_CAP = 256  # checks beyond which a pair weighs no more in the calibration
CALIBRATION_SLOPE_SPREAD = 0.1  # the calibration's slope is shrunk towards 1 over this much similarity
CALIBRATION_PRIOR_CHECKS = 16.0  # the calibration's level is shrunk towards the identity by this many checks


def logit(p: float) -> float:
    p = min(max(p, 1e-4), 1 - 1e-4)
    return math.log(p / (1 - p))


def shifted(rate: float, log_odds: float) -> float:
    """`rate` moved by `log_odds` on the logit scale (0 and 1 stay put)."""
    if log_odds == 0 or rate <= 0.0 or rate >= 1.0:
        return rate
    return 1 / (1 + math.exp(-(logit(rate) + log_odds)))


@dataclass(frozen=True)
class Calibration:
    """acceptance ~ intercept + slope * similarity, clipped to [0, 1]."""

    intercept: float = 0.0
    slope: float = 1.0
    pairs: int = 0          # observed pairs it was fitted on

    def __call__(self, similarity: float) -> float:
        return min(1.0, max(0.0, self.intercept + self.slope * similarity))

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float, float]]) -> Calibration:
        """From (similarity, acceptance, weight) of observed pairs: weighted least squares with the slope
        shrunk towards 1 (Leviathan et al.: under sampling the acceptance of a token is exactly 1 - TV),
        as if two more pairs of full weight sat on the slope-1 line through the points' weighted mean,
        `CALIBRATION_SLOPE_SPREAD` of similarity either side of it, and its level shrunk towards the
        identity, as if `CALIBRATION_PRIOR_CHECKS` checks sat on it at the points' mean similarity. With
        no pair, the identity; with one, the identity shifted towards it by its weight; the line follows
        the points' own slope once their similarities spread wider than that. A pool's pairs are often
        alike in similarity, and a second pair seen in a single lucky cycle (all of its drafts accepted, a
        little more similar) fits a steep slope alone, which puts every less measured pair at acceptance 1;
        and a first pair seen in a single lucky cycle (the first request's few drafts all accepted, a
        tenth of a check in the pool's recent reports), taken at its word, puts every pair at acceptance 1
        until more are measured (at batch 4 a plan of such a snapshot priced 1m -> 29m at W6 at 7 tokens a
        row a cycle, where 4 came out)."""
        if not points:
            return cls()
        w = sum(p[2] for p in points)
        mx = sum(x * wt for x, _, wt in points) / w
        my = (sum(y * wt for _, y, wt in points) + CALIBRATION_PRIOR_CHECKS * mx) / (w + CALIBRATION_PRIOR_CHECKS)
        prior = 2 * CALIBRATION_WEIGHT_CAP * CALIBRATION_SLOPE_SPREAD**2   # the two pairs' sum of squares
        sxx = sum(wt * (x - mx) ** 2 for x, _, wt in points) + prior
        sxy = sum(wt * (x - mx) * (y - my) for x, y, wt in points) + prior
        # acceptance does not fall as similarity rises: a falling line is noise over a few pairs (it makes
        # the least similar pair of the pool the most promising); the least squares line with slope >= 0
        # is then the flat one
        slope = max(0.0, sxy / sxx)
        return cls(my - slope * mx, slope, len(points))


@dataclass(frozen=True)
class PositionRate:
    rate: float
    checks: float   # effective checks behind the EMA (see the module's docstring)


class RecentReports:
    """Per (pair, position), how much of the pool's recent running reached it: the reports (cycles that
    checked it) in each snapshot's growth of its count, decayed by e^(-1/`cycles`) per report of the
    pool (reports at position 0 over every pair: about one per cycle of each running batch), over the
    same count of the pool's most reported pair at position 0. It fades only while the pool runs on
    without the pair, not while nothing runs. A position seen for the first time counts whole."""

    def __init__(self, cycles: float):
        self.cycles = cycles
        self._seen: dict[tuple[Pair, int], tuple[int, float, int]] = {}   # -> (samples, count, pool clock)
        self._lock = threading.Lock()

    def update(self, snapshot: Snapshot) -> None:
        clock = sum(a.samples for a in snapshot.acceptance if a.position == 0)
        with self._lock:
            for a in snapshot.acceptance:
                key = ((a.drafter, a.verifier, a.mode), a.position)
                old = self._seen.get(key)
                if old is None or a.samples < old[0] or clock < old[2]:   # new, or the store was reset
                    count = float(a.samples)
                else:
                    samples, count, then = old
                    count = count * math.exp(-(clock - then) / self.cycles) + (a.samples - samples)
                self._seen[key] = (a.samples, count, clock)

    def shares(self) -> dict[tuple[Pair, int], float]:
        """(pair, position) -> its recent reports over the most reported pair's at position 0, in [0, 1]."""
        with self._lock:
            top = max((c for (_, pos), (_, c, _) in self._seen.items() if pos == 0), default=0.0)
            return {key: min(1.0, count / top) if top > 0 else 0.0 for key, (_, count, _) in self._seen.items()}


class AcceptanceEstimates:
    def __init__(self, snapshot: Snapshot | None, offline: Iterable[PairSimilarity] = (),
                 prior_weight: float = 16.0, default_acceptance: float = 0.5,
                 recent: Mapping[tuple[Pair, int], float] | None = None,
                 text_shift: Mapping[Pair, float] | None = None, free: Iterable[str] = (),
                 free_prior: float = 0.3):
        """`recent`: `RecentReports.shares()`; without it, each position's share of its pair's reports.
        `text_shift`: per pair, log-odds its measured rates move by to describe the text the pool runs now
        rather than the text they were measured on (the scheduler's `text_shifts`). `free`: the levels that
        run no model (the lookup): their proposals have no distribution and no similarity, so a pair
        drafted by one takes `free_prior` as its prior, and stays out of the calibration."""
        self.free, self.free_prior = frozenset(free), free_prior
        self.prior_weight = prior_weight
        self.default_acceptance = default_acceptance
        self.observed: dict[Pair, dict[int, PositionRate]] = {}
        self.live_similarity: dict[Pair, float] = {}
        self.offline_similarity: dict[Pair, float] = {(s.drafter, s.verifier, Mode(s.mode)): s.similarity
                                                         for s in offline}
        if snapshot is not None:
            alpha = snapshot.acceptance_alpha or EmaConstants.acceptance_alpha
            memory = (2 - alpha) / alpha        # checks an EMA effectively averages
            reports: dict[Pair, int] = {}
            for a in snapshot.acceptance:
                pair = (a.drafter, a.verifier, a.mode)
                reports[pair] = max(reports.get(pair, 0), a.samples)
            for a in snapshot.acceptance:
                if a.proposed_total > 0:
                    pair = (a.drafter, a.verifier, a.mode)
                    checks = min(float(a.proposed_total), memory)
                    # a position reached in a fraction of the pool's (or its pair's) reports last moved that
                    # much longer ago
                    share = recent.get((pair, a.position), 0.0) if recent is not None else a.samples / reports[pair]
                    checks *= share
                    rate = shifted(a.ema_acceptance_rate, (text_shift or {}).get(pair, 0.0))   # unmoved at 0
                    self.observed.setdefault(pair, {})[a.position] = PositionRate(rate, checks)
            for s in snapshot.similarity:
                self.live_similarity[(s.drafter, s.verifier, s.mode)] = s.ema_similarity
        self.calibration = {mode: Calibration.fit(self._calibration_points(mode)) for mode in Mode}
        self._rates: dict[Pair, list[float]] = {}

    def similarity(self, pair: Pair) -> float | None:
        drafter, verifier, mode = pair
        offline = self.offline_similarity.get(pair)
        if offline is None and mode is Mode.COUPLED:   # the pool's 1 - TV stands for a coupled pair's too: the
            offline = self.offline_similarity.get((drafter, verifier, Mode.SAMPLING))   # calibration maps it
        return offline if offline is not None else self.live_similarity.get(pair)

    def pair_acceptance(self, pair: Pair) -> float | None:
        """Realized acceptance of an observed pair, over its positions weighted by checks; None if unobserved."""
        positions = self.observed.get(pair)
        if not positions:
            return None
        total = sum(p.checks for p in positions.values())
        return sum(p.rate * p.checks for p in positions.values()) / total

    def _calibration_points(self, mode: Mode) -> list[tuple[float, float, float]]:
        points = []
        for pair, positions in self.observed.items():
            sim = self.similarity(pair)
            # weighted by checks, capped: a pair seen once counts little
            if pair[2] == mode and sim is not None and level_of(pair[0]) not in self.free:
                checks = sum(p.checks for p in positions.values())
                points.append((sim, self.pair_acceptance(pair), min(checks, CALIBRATION_WEIGHT_CAP)))
        return points

    def prior(self, pair: Pair) -> float:
        """A model pair's calibrated similarity; a model-free level's `free_prior`; that level's after a
        match of some length (`by_match`), its estimate over every match at position 0."""
        drafter, verifier, mode = pair
        if drafter in self.free:
            return self.free_prior
        level = level_of(drafter)
        if level != drafter and level in self.free:
            return self.rates((level, verifier, mode), 1)[0]
        sim = self.similarity(pair)
        return self.default_acceptance if sim is None else self.calibration[pair[2]](sim)

    def rates(self, pair: Pair, positions: int) -> list[float]:
        """a_0 .. a_(positions - 1) for the pair."""
        cached = self._rates.get(pair)
        if cached is not None and len(cached) >= positions:
            return cached
        prior = self.prior(pair)
        measured = self.observed.get(pair, {})
        w = self.prior_weight
        total = sum(m.checks for m in measured.values())
        pooled = (sum(m.rate * m.checks for m in measured.values()) + w * prior) / (total + w)
        out, last = [], pooled
        for i in range(positions):
            m = measured.get(i)
            if m is not None:
                last = (m.checks * m.rate + w * last) / (m.checks + w)
            out.append(last)
        self._rates[pair] = out
        return out

    def pairs_seen(self) -> Mapping[Pair, int]:
        """Checks at position 0 per observed pair: how much each pair has been measured."""
        return {pair: pos[min(pos)].checks for pair, pos in self.observed.items() if pos}
