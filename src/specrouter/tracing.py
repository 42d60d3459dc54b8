"""OpenTelemetry for every service, configured by OpenTelemetry's standard variables.

- `OTEL_TRACES_EXPORTER`: `otlp` (spans go over OTLP/gRPC to `OTEL_EXPORTER_OTLP_ENDPOINT`, e.g. a Jaeger
  collector), `console`, or `none`. Unset: `otlp` when an OTLP endpoint is set, else `none`, so a local
  run without a collector logs no export errors.
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`: the resource; each service has its own default name.
- `OTEL_BSP_*`: the batch span processor's schedule and limits.
gRPC instrumentation carries the trace context across processes in request metadata, so one request's
spans from the router, the workers and the profiler form one trace.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

_configured = False


def configure(default_service_name: str, env: Mapping[str, str]) -> None:
    """Installs the tracer provider and the gRPC instrumentation; call once from a service's main."""
    global _configured
    if _configured:
        return
    _configured = True
    exporter_name = env.get("OTEL_TRACES_EXPORTER") or (
        "otlp" if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") else "none")
    resource = Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME") or default_service_name})
    provider = TracerProvider(resource=resource)
    exporting = False
    for name in exporter_name.split(","):
        name = name.strip()
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            exporting = True
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            exporting = True
        elif name not in ("none", ""):
            raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: use otlp, console or none")
    if exporting:   # otherwise the API's no-op tracer: spans that go nowhere cost nothing to record,
        trace.set_tracer_provider(provider)   # and the trace context still travels between services
    from opentelemetry.instrumentation.grpc import GrpcInstrumentorClient, GrpcInstrumentorServer

    GrpcInstrumentorServer().instrument()
    GrpcInstrumentorClient().instrument()


def shutdown() -> None:
    """Flushes spans still waiting for export."""
    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)
