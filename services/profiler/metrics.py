"""What routers measure and what the scheduler reads back: samples in, EMA records, metrics out.

Every metric is an exponential moving average over the reports of one key, kept per component of a
vector x together with the running total of x:

    ema_n = (1 - alpha) * ema_{n-1} + alpha * x_n,    ema_0 = 0,    total_n = total_{n-1} + x_n

Forward latency keeps x = (1, value) and reads the mean as ema[1] / ema[0]: dividing by the EMA of a
constant 1 (= 1 - (1 - alpha)^n) removes the pull towards the zero start, so the first report counts at
face value. Similarity keeps x = (1, positions, positions * similarity), its mean ema[2] / ema[1]
weighted by the positions compared.

Acceptance keeps x = (1, accepted, proposed) and its memory counts checks, not reports: a report of n
checks is taken as n steps of `acceptance_alpha`, each bringing x / n,

    ema_n = (1 - a)^n * ema_{n-1} + (1 - (1 - a)^n) * x_n / n,

so the rate ema[1] / ema[2] is the EMA, check by check, of whether a check was accepted (ema[2] is the
EMA of a constant 1), and the totals are exact counts. Counted in reports, the memory would be a fixed
number of cycles whatever the batch: at batch 1 that is a few dozen checks, the acceptance of the last
request or two, and a scheduler reading it chases one request's luck (long windows picked on a lucky
request's rates emit far fewer tokens than predicted); at batch 16 the same number of reports is
hundreds of checks.

Batch size and tokens per row are kept exactly up to 16 (windows of 1 to 8 verify 2 to 9 tokens, and 3
tokens cost measurably less than 4 on a CPU), beyond that per power-of-two bucket (17..32 -> 32): a
forward pass costs about the same across a large bucket, and the number of keys stays logarithmic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from specrouter.contract.measures import EmaConstants, Mode, bucket
from specrouter.profiler.errors import InvalidMeasurement

MAX_BUCKETED = 1 << 16            # largest batch size or tokens per row accepted
MAX_DRAFT_POSITION = 255          # deepest 0-based draft position tracked
MAX_NAME_CHARS = 256
MAX_FORWARD_NS = 3_600 * 10**9    # one hour: anything longer is a unit mistake

FORWARD, ACCEPTANCE, SIMILARITY = "forward", "acceptance", "similarity"
FAMILIES = (FORWARD, ACCEPTANCE, SIMILARITY)


def _check_name(field: str, name: str) -> None:
    if not 0 < len(name) <= MAX_NAME_CHARS:
        raise InvalidMeasurement(f"{field} must be a model name of 1 to {MAX_NAME_CHARS} characters, got {name!r}")


def _check_range(field: str, value: float, low: float, high: float, hint: str = "") -> None:
    if not low <= value <= high:  # also false for NaN
        raise InvalidMeasurement(f"{field} must be in [{low}, {high}], got {value}{hint}")


def _check_pair(drafter: str, verifier: str) -> None:
    _check_name("drafter", drafter)
    _check_name("verifier", verifier)
    if drafter == verifier:
        raise InvalidMeasurement(f"drafter and verifier are both {drafter!r}: a pair needs two different models")


@dataclass(frozen=True)
class ForwardSample:
    """One forward pass of `model` over `batch_size` rows of `tokens_per_row` tokens."""

    family: ClassVar[str] = FORWARD
    model: str
    batch_size: int
    tokens_per_row: int
    forward_ns: int

    def __post_init__(self) -> None:
        _check_name("model", self.model)
        _check_range("batch_size", self.batch_size, 1, MAX_BUCKETED)
        _check_range("tokens_per_row", self.tokens_per_row, 1, MAX_BUCKETED)
        _check_range("forward_ns", self.forward_ns, 1, MAX_FORWARD_NS,
                     " (nanoseconds from a monotonic clock, e.g. time.perf_counter_ns)")

    def key(self) -> tuple:
        return (self.model, bucket(self.batch_size), bucket(self.tokens_per_row))

    def vector(self) -> tuple[float, ...]:
        return (1.0, float(self.forward_ns))


@dataclass(frozen=True)
class AcceptanceSample:
    """Of `proposed` rows whose token at draft `position` was checked, `accepted` were accepted."""

    family: ClassVar[str] = ACCEPTANCE
    drafter: str
    verifier: str
    mode: Mode
    position: int
    accepted: int
    proposed: int

    def __post_init__(self) -> None:
        _check_pair(self.drafter, self.verifier)
        _check_range("position", self.position, 0, MAX_DRAFT_POSITION, " (0-based position in the proposal)")
        if self.proposed < 1:
            raise InvalidMeasurement(f"proposed must be >= 1, got {self.proposed}: "
                                     "send no measurement for a position that no row reached")
        if not 0 <= self.accepted <= self.proposed:
            raise InvalidMeasurement(f"accepted ({self.accepted}) must be in [0, proposed ({self.proposed})]: "
                                     "count only rows whose token at this position was checked")

    def key(self) -> tuple:
        return (self.drafter, self.verifier, self.mode.value, self.position)

    def vector(self) -> tuple[float, ...]:
        return (1.0, float(self.accepted), float(self.proposed))


@dataclass(frozen=True)
class SimilaritySample:
    """1 - mean total variation distance between the two models' rows at the same positions."""

    family: ClassVar[str] = SIMILARITY
    drafter: str
    verifier: str
    mode: Mode
    similarity: float
    positions: int = 1

    def __post_init__(self) -> None:
        _check_pair(self.drafter, self.verifier)
        _check_range("similarity", self.similarity, 0.0, 1.0, " (1 - total variation distance)")
        if self.positions < 1:
            raise InvalidMeasurement(f"positions must be >= 1, got {self.positions}: "
                                     "send no similarity for a verify call that compared no position")

    def key(self) -> tuple:
        return (self.drafter, self.verifier, self.mode.value)

    def vector(self) -> tuple[float, ...]:
        return (1.0, float(self.positions), float(self.positions) * self.similarity)


Sample = ForwardSample | AcceptanceSample | SimilaritySample


@dataclass(frozen=True)
class Update:
    """One sample as a store applies it: the record `field` of `family` takes in the vector `x`."""

    family: str
    field: str   # the sample's key as compact JSON
    x: tuple[float, ...]

    @classmethod
    def of(cls, sample: Sample) -> Update:
        return cls(sample.family, json.dumps(sample.key(), separators=(",", ":")), sample.vector())

    def weights(self, constants: EmaConstants) -> tuple[float, float]:
        """(keep, gain) of this update: ema <- keep * ema + gain * x (see the module's docstring)."""
        if self.family != ACCEPTANCE:
            return 1 - constants.ema_alpha, constants.ema_alpha
        checks = self.x[2]
        keep = (1 - constants.acceptance_alpha) ** checks
        return keep, (1 - keep) / checks


@dataclass(frozen=True)
class Ema:
    """Per component of x: its EMA from a zero start, and its running total."""

    ema: tuple[float, ...]
    total: tuple[float, ...]

    @classmethod
    def zero(cls, size: int) -> Ema:
        return cls((0.0,) * size, (0.0,) * size)

    def updated(self, x: Sequence[float], keep: float, gain: float) -> Ema:
        # The Redis store's Lua script computes the same expressions in the same order: keep them in step.
        return Ema(tuple(keep * e + gain * v for e, v in zip(self.ema, x)),
                   tuple(t + v for t, v in zip(self.total, x)))


Records = Mapping[str, Mapping[str, Ema]]   # family -> field -> record


@dataclass(frozen=True)
class ForwardLatency:
    model: str
    batch_size_bucket: int
    tokens_per_row_bucket: int
    ema_forward_ns: float
    samples: int


@dataclass(frozen=True)
class AcceptanceRate:
    drafter: str
    verifier: str
    mode: Mode
    position: int
    ema_acceptance_rate: float
    accepted_total: int
    proposed_total: int
    samples: int


@dataclass(frozen=True)
class Similarity:
    drafter: str
    verifier: str
    mode: Mode
    ema_similarity: float
    samples: int
    positions_total: int


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


@dataclass(frozen=True)
class MetricsSnapshot:
    forward: tuple[ForwardLatency, ...] = ()
    acceptance: tuple[AcceptanceRate, ...] = ()
    similarity: tuple[Similarity, ...] = ()

    @classmethod
    def from_records(cls, records: Records) -> MetricsSnapshot:
        def rows(family: str) -> list[tuple[list, Ema]]:
            return sorted(((json.loads(f), r) for f, r in records.get(family, {}).items()), key=lambda fr: fr[0])

        forward = [ForwardLatency(m, b, k, _ratio(r.ema[1], r.ema[0]), round(r.total[0]))
                   for (m, b, k), r in rows(FORWARD)]
        acceptance = [AcceptanceRate(d, v, Mode(mode), pos, _ratio(r.ema[1], r.ema[2]),
                                     round(r.total[1]), round(r.total[2]), round(r.total[0]))
                      for (d, v, mode, pos), r in rows(ACCEPTANCE)]
        similarity = [Similarity(d, v, Mode(mode), _ratio(r.ema[2], r.ema[1]), round(r.total[0]), round(r.total[1]))
                      for (d, v, mode), r in rows(SIMILARITY) if len(r.ema) == 3]
        return cls(tuple(forward), tuple(acceptance), tuple(similarity))
