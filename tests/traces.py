"""An OTLP/gRPC trace endpoint for the tests that follow a request's trace across the services."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass
class Span:
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str
    service: str


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent, with the name of the service that sent it."""

    def __init__(self):
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    def settled(self, service: str, quiet_s: float, wait_s: float) -> int:
        """The number of spans kept, once `service` has sent none for `quiet_s` seconds (at most `wait_s`
        seconds of waiting): the spans of its requests that ended before come in its next export batch.
        (Other services send spans all the time: the router's profiler snapshots, every second.)"""
        def sent() -> tuple[int, int]:
            with self.lock:
                return len(self.spans), sum(s.service == service for s in self.spans)

        deadline = time.monotonic() + wait_s
        count, of_service = sent()
        since = time.monotonic()
        while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
            time.sleep(0.05)
            count, now = sent()
            if now != of_service:
                of_service, since = now, time.monotonic()
        return count

    def Export(self, request, context):
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope in resource_spans.scope_spans:
                    self.spans += [Span(s.trace_id, s.span_id, s.parent_span_id, s.name, service) for s in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()


@contextmanager
def trace_endpoint() -> Iterator[tuple[TraceReceiver, int]]:
    """A receiver serving on a free local port: (receiver, port)."""
    receiver = TraceReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, port
    finally:
        server.stop(0)
