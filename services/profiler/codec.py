"""Protobuf at the edge: requests to domain samples, domain snapshots to responses."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from specrouter.profiler.errors import InvalidMeasurement
from specrouter.profiler.metrics import AcceptanceSample, ForwardSample, Sample, SimilaritySample
from specrouter.contract.measures import Mode
from specrouter.profiler.resilient import SnapshotView
from specrouter.v1 import profiler_pb2 as pb

_MODE_FROM_PB = {pb.DECODING_MODE_GREEDY: Mode.GREEDY, pb.DECODING_MODE_SAMPLING: Mode.SAMPLING,
                 pb.DECODING_MODE_COUPLED: Mode.COUPLED}
_MODE_TO_PB = {mode: value for value, mode in _MODE_FROM_PB.items()}

M = TypeVar("M")


def _mode(value: int) -> Mode:
    if value not in _MODE_FROM_PB:
        raise InvalidMeasurement(f"mode must be DECODING_MODE_GREEDY, DECODING_MODE_SAMPLING or DECODING_MODE_COUPLED, "
                                 f"got {value}")
    return _MODE_FROM_PB[value]


def _each(kind: str, items: Iterable[M], make: Callable[[M], Sample]) -> Iterator[Sample]:
    """Converts every item, naming the bad one (`acceptance[2]: ...`) in the error."""
    for i, item in enumerate(items):
        try:
            yield make(item)
        except InvalidMeasurement as error:
            raise InvalidMeasurement(f"{kind}[{i}]: {error}") from None


def samples_from_pb(request: pb.ReportRequest) -> list[Sample]:
    """Every measurement of the report; raises InvalidMeasurement on the first bad one."""
    return [
        *_each("forward", request.forward,
               lambda m: ForwardSample(m.model, m.batch_size, m.tokens_per_row, m.forward_ns)),
        *_each("acceptance", request.acceptance,
               lambda m: AcceptanceSample(m.drafter, m.verifier, _mode(m.mode), m.position, m.accepted, m.proposed)),
        *_each("similarity", request.similarity,
               lambda m: SimilaritySample(m.drafter, m.verifier, _mode(m.mode), m.similarity, m.positions or 1)),
    ]


def snapshot_to_pb(view: SnapshotView) -> pb.SnapshotResponse:
    metrics = view.metrics
    return pb.SnapshotResponse(
        forward=[pb.ForwardLatency(model=f.model, batch_size_bucket=f.batch_size_bucket,
                                   tokens_per_row_bucket=f.tokens_per_row_bucket,
                                   ema_forward_ns=f.ema_forward_ns, samples=f.samples) for f in metrics.forward],
        acceptance=[pb.AcceptanceRate(drafter=a.drafter, verifier=a.verifier, mode=_MODE_TO_PB[a.mode],
                                      position=a.position, ema_acceptance_rate=a.ema_acceptance_rate,
                                      accepted_total=a.accepted_total, proposed_total=a.proposed_total,
                                      samples=a.samples) for a in metrics.acceptance],
        similarity=[pb.Similarity(drafter=s.drafter, verifier=s.verifier, mode=_MODE_TO_PB[s.mode],
                                  ema_similarity=s.ema_similarity, samples=s.samples,
                                  positions_total=s.positions_total) for s in metrics.similarity],
        stale=view.stale, age_ms=view.age_ms, ema_alpha=view.constants.ema_alpha,
        acceptance_alpha=view.constants.acceptance_alpha, reports_dropped=view.reports_dropped,
    )
