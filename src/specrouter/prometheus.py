"""What every service's Prometheus metrics share: a registry of the service's own, `/metrics` over HTTP on a
port of its own, and the count and duration of the service's gRPC calls by method and status.

Each service object owns a `CollectorRegistry` (not prometheus_client's global one), so that several
services in one process (the tests) keep their series apart. Names follow Prometheus' conventions:
`specrouter_` first, the unit last (`_seconds`, `_tokens`), counters end in `_total`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.exposition import start_http_server

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
NO_METRICS = -1   # a metrics_port below 0 serves no endpoint; 0 picks a free port
# seconds: 100 us (a worker's Release) to 30 s (a long generation)
LATENCY_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0)


def new_registry() -> CollectorRegistry:
    """A registry for one service, with the standard process series (CPU seconds, resident memory, ...)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    return registry


@dataclass
class MetricsEndpoint:
    """`/metrics` served over HTTP from a daemon thread."""

    url: str
    close: Callable[[], None]


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsEndpoint | None:
    """Serves the registry at http://host:port/metrics (port 0: a free one); None when port < 0."""
    if port < 0:
        return None
    bind = host.strip("[]")   # gRPC's "[::]" is the socket's "::"
    try:
        server, thread = start_http_server(port, addr=bind, registry=registry)
    except OSError:
        if bind != "::":
            raise
        bind = "0.0.0.0"   # a host without IPv6: every IPv4 interface, as gRPC does for "[::]"
        server, thread = start_http_server(port, addr=bind, registry=registry)
    bound = server.server_port
    shown = f"[{bind}]" if ":" in bind else bind

    def close() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return MetricsEndpoint(f"http://{shown}:{bound}{METRICS_PATH}", close)


def metrics_line(service: str, endpoint: MetricsEndpoint | None) -> str:
    """The line a service prints before its listening line, e.g. `router metrics at http://HOST:PORT/metrics`
    (empty without an endpoint); the launcher reads it."""
    return f"{service} metrics at {endpoint.url}" if endpoint is not None else ""


class RpcMetrics(grpc.ServerInterceptor):
    """Counts a server's calls by method and final status, and times them (a stream until its last message).
    A call that no handler serves (UNIMPLEMENTED) is left out."""

    def __init__(self, registry: CollectorRegistry):
        self.handled = Counter("specrouter_grpc_server_handled", "gRPC calls completed, by method and status code",
                               ["grpc_service", "grpc_method", "grpc_code"], registry=registry)
        self.seconds = Histogram("specrouter_grpc_server_handling_seconds",
                                 "Time from a gRPC call's start to its status, by method",
                                 ["grpc_service", "grpc_method"], buckets=LATENCY_BUCKETS_S, registry=registry)

    def observe(self, full_method: str, code: str, seconds: float) -> None:
        service, _, method = full_method.lstrip("/").rpartition("/")
        self.handled.labels(service, method, code).inc()
        self.seconds.labels(service, method).observe(seconds)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming:   # no service here streams requests
            return handler
        method = handler_call_details.method
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(self._streaming(method, handler.unary_stream),
                                                        handler.request_deserializer, handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(self._unary(method, handler.unary_unary),
                                                   handler.request_deserializer, handler.response_serializer)

    def _unary(self, method: str, behaviour):
        def call(request, context):
            started, code = time.perf_counter(), "UNKNOWN"
            try:
                reply = behaviour(request, context)
                code = _code(context, "OK")
                return reply
            except BaseException:
                code = _code(context, "UNKNOWN")
                raise
            finally:
                self.observe(method, code, time.perf_counter() - started)
        return call

    def _streaming(self, method: str, behaviour):
        def call(request, context) -> Iterator:
            started, code = time.perf_counter(), "UNKNOWN"
            try:
                yield from behaviour(request, context)
                code = _code(context, "OK")
            except GeneratorExit:   # the client went away between messages
                code = "CANCELLED"
                raise
            except BaseException:
                code = _code(context, "UNKNOWN")
                raise
            finally:
                self.observe(method, code, time.perf_counter() - started)
        return call


def _code(context: grpc.ServicerContext, default: str) -> str:
    """The status the handler set (abort, set_code), else `default`."""
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else default
