"""The worker's Prometheus metrics: the states and rows it holds, its forward passes per operation, and its
calls by method and status. docs/deployment.md lists them."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge, Histogram, Info

from specrouter.prometheus import LATENCY_BUCKETS_S, RpcMetrics, new_registry
from specrouter.contract.calls import ForwardTiming
from specrouter.worker.engine import WorkerEngine

OPERATIONS = ("prefill", "draft", "verify")


class WorkerMetrics:
    def __init__(self, engine: WorkerEngine, labels: dict[str, str], registry: CollectorRegistry | None = None):
        """`labels`: what the worker serves (model, device, dtype), the value of specrouter_worker_info."""
        r = self.registry = registry or new_registry()
        self.rpc = RpcMetrics(r)
        Info("specrouter_worker", "The model this worker serves", registry=r).info(labels)
        Gauge("specrouter_worker_live_states", "KV states held (batches in flight on this model)",
              registry=r).set_function(lambda: len(engine.state_ids()))
        Gauge("specrouter_worker_rows", "Rows held across every state (requests in flight on this model)",
              registry=r).set_function(engine.live_rows)
        self.forward_seconds = Histogram("specrouter_worker_forward_duration_seconds", "One forward pass of the "
                                         "model, by the operation it served (prefill, draft, verify)", ["operation"],
                                         buckets=LATENCY_BUCKETS_S, registry=r)
        for operation in OPERATIONS:   # every series from the start, empty
            self.forward_seconds.labels(operation)

    def observe_forwards(self, operation: str, timings: Sequence[ForwardTiming]) -> None:
        for t in timings:
            self.forward_seconds.labels(operation).observe(t.forward_ns / 1e9)
