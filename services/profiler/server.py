"""The profiler's gRPC server: ProfilerService, the standard health service and reflection.

Health turns SERVING as soon as the server is built: the profiler serves with its store down too (stale
snapshots, dropped reports), so an outage of Redis is reported in the snapshots, not by health.
"""

from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specrouter import serving
from specrouter.tls import ServerTLS
from specrouter.profiler import codec
from specrouter.profiler.errors import domain_errors
from specrouter.profiler.metrics import Update
from specrouter.profiler.prometheus import ProfilerMetrics
from specrouter.profiler.resilient import ResilientMetrics
from specrouter.profiler.settings import ProfilerSettings
from specrouter.profiler.store import MetricStore
from specrouter.v1 import profiler_pb2 as pb
from specrouter.v1 import profiler_pb2_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ProfilerService"].full_name


class ProfilerServicer(profiler_pb2_grpc.ProfilerServiceServicer):
    def __init__(self, metrics: ResilientMetrics, exported: ProfilerMetrics | None = None):
        self._metrics = metrics
        self._exported = exported   # the Prometheus metrics, if any

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportResponse:
        with domain_errors(context):
            updates = [Update.of(sample) for sample in codec.samples_from_pb(request)]
        stored = self._metrics.report(updates)
        if self._exported is not None:
            self._exported.observe_report(stored, len(request.forward), len(request.acceptance),
                                          len(request.similarity))
        return pb.ReportResponse(stored=stored)

    def Snapshot(self, request: pb.SnapshotRequest, context: grpc.ServicerContext) -> pb.SnapshotResponse:
        view = self._metrics.snapshot()
        if self._exported is not None:
            self._exported.observe_snapshot(view.stale)
        return codec.snapshot_to_pb(view)


def create_server(settings: ProfilerSettings, store: MetricStore, health_servicer: health.HealthServicer | None = None,
                  tls: ServerTLS | None = None, exported: ProfilerMetrics | None = None) -> tuple[grpc.Server, int]:
    """A profiler server bound to `settings.host:settings.port` (0: a free port; over TLS with `tls`), not
    started yet; `exported`: the Prometheus metrics it keeps up to date."""
    health_servicer = health.HealthServicer() if health_servicer is None else health_servicer
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=settings.max_workers),
                         interceptors=[exported.rpc] if exported is not None else None)
    metrics = ResilientMetrics(store, settings.store_retry_s)
    if exported is not None:
        exported.watch(metrics)
    profiler_pb2_grpc.add_ProfilerServiceServicer_to_server(ProfilerServicer(metrics, exported), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = serving.listen(server, settings.host, settings.port, tls)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port


def shutdown(server: grpc.Server, health_servicer: health.HealthServicer, grace_s: float) -> None:
    """Health turns NOT_SERVING, new calls are refused, calls in flight get `grace_s` to finish."""
    health_servicer.enter_graceful_shutdown()
    server.stop(grace_s).wait()
