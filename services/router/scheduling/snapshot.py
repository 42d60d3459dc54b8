"""The profiler's metrics as the scheduler reads them: domain records, decoded from the wire at the router's
edge (`specrouter.router.measurements.snapshot_from_pb`), so that nothing here depends on protobuf."""

from __future__ import annotations

from dataclasses import dataclass

from specrouter.profiler.metrics import AcceptanceRate, ForwardLatency, MetricsSnapshot, Similarity


@dataclass(frozen=True)
class Snapshot:
    """One read of the profiler: forward latency per (model, batch bucket, tokens bucket), acceptance per
    (drafter, verifier, mode, position), similarity per (drafter, verifier, mode), and the EMA constant
    its acceptance rates were kept with (0 when the profiler did not say)."""

    forward: tuple[ForwardLatency, ...] = ()
    acceptance: tuple[AcceptanceRate, ...] = ()
    similarity: tuple[Similarity, ...] = ()
    acceptance_alpha: float = 0.0

    @classmethod
    def of(cls, metrics: MetricsSnapshot, acceptance_alpha: float) -> Snapshot:
        return cls(metrics.forward, metrics.acceptance, metrics.similarity, acceptance_alpha)
