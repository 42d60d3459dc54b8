"""Every HTTP request, observed: a server span that is the root of the request's trace (the router's and
the workers' spans hang under it), and its count, time and time to the first byte as Prometheus metrics.

A stream's time runs to its last byte; its first byte comes with its first tokens (the gateway answers
once the router has sent them). docs/deployment.md lists the series.
"""

from __future__ import annotations

import time

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specrouter.prometheus import LATENCY_BUCKETS_S, new_registry

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health")
OTHER_ROUTE = "other"   # any other path, so that a scan of made-up paths adds no series
CLIENT_GONE = 499       # the status a request counts under when its client left before the answer


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or new_registry()
        self.requests = Counter("specrouter_gateway_requests", "HTTP requests answered, by route, method and "
                                f"status ({CLIENT_GONE}: the client left first)", ["route", "method", "status"],
                                registry=r)
        self.seconds = Histogram("specrouter_gateway_request_duration_seconds", "Time from a request's arrival to "
                                 "the last byte of its answer, by route", ["route"], buckets=LATENCY_BUCKETS_S,
                                 registry=r)
        self.first_byte = Histogram("specrouter_gateway_first_byte_seconds", "Time from a request's arrival to the "
                                    "first byte of its answer's body (a stream's first tokens), by route", ["route"],
                                    buckets=LATENCY_BUCKETS_S, registry=r)
        self.in_flight = Gauge("specrouter_gateway_requests_in_flight", "HTTP requests being answered", registry=r)
        self.router_errors = Counter("specrouter_gateway_router_errors", "Router calls that ended with a status "
                                     "other than OK, by gRPC status code", ["code"], registry=r)


def route_of(path: str) -> str:
    return path if path in ROUTES else OTHER_ROUTE


class Observed:
    """ASGI middleware around the whole app."""

    def __init__(self, app, metrics: GatewayMetrics):
        self.app = app
        self.metrics = metrics
        self.tracer = trace.get_tracer("specrouter.gateway")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route, method = route_of(scope["path"]), scope["method"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        started, first_byte, status = time.perf_counter(), None, 500

        async def send_observed(message) -> None:
            nonlocal first_byte, status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and first_byte is None:
                first_byte = time.perf_counter()
            await send(message)

        # a caller's own trace context (traceparent) is continued; without one the gateway's span is the root
        with self.tracer.start_as_current_span(f"{method} {route}", context=propagate.extract(headers),
                                               kind=SpanKind.SERVER, record_exception=False,
                                               attributes={"http.request.method": method, "http.route": route,
                                                           "url.path": scope["path"]}) as span:
            self.metrics.in_flight.inc()
            try:
                await self.app(scope, receive, send_observed)
            finally:
                self.metrics.in_flight.dec()
                self.metrics.requests.labels(route, method, str(status)).inc()
                self.metrics.seconds.labels(route).observe(time.perf_counter() - started)
                if first_byte is not None:
                    self.metrics.first_byte.labels(route).observe(first_byte - started)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
