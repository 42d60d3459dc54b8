"""Report builders shared by the profiler's tests."""

from __future__ import annotations

from specrouter.v1 import profiler_pb2 as pb

GREEDY, SAMPLING = pb.DECODING_MODE_GREEDY, pb.DECODING_MODE_SAMPLING


def forward(forward_ns: int, model: str = "t", batch_size: int = 1, tokens_per_row: int = 1) -> pb.ForwardMeasurement:
    return pb.ForwardMeasurement(model=model, batch_size=batch_size, tokens_per_row=tokens_per_row,
                                 forward_ns=forward_ns)


def acceptance(accepted: int, proposed: int, position: int = 0, mode: int = GREEDY,
               drafter: str = "s", verifier: str = "t") -> pb.AcceptanceMeasurement:
    return pb.AcceptanceMeasurement(drafter=drafter, verifier=verifier, mode=mode, position=position,
                                    accepted=accepted, proposed=proposed)


def similarity(value: float, drafter: str = "s", verifier: str = "t", mode: int = GREEDY,
               positions: int = 1) -> pb.SimilarityMeasurement:
    return pb.SimilarityMeasurement(drafter=drafter, verifier=verifier, similarity=value, mode=mode,
                                    positions=positions)


def snapshot(stub) -> pb.SnapshotResponse:
    return stub.Snapshot(pb.SnapshotRequest(), timeout=10)


def without_age(response: pb.SnapshotResponse) -> pb.SnapshotResponse:
    copy = pb.SnapshotResponse()
    copy.CopyFrom(response)
    copy.age_ms = 0
    return copy
