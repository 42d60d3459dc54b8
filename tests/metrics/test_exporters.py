"""The metrics in process: registries of their own, the endpoint's port setting, the profiler's view of an
outage of its store, the gRPC status of each call, and the launcher keeping a restarted service's metrics
port."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from prometheus_client import REGISTRY

from specrouter.launcher import with_port
from specrouter.profiler.errors import StoreUnavailable
from specrouter.profiler.memory_store import MemoryStore
from specrouter.profiler.prometheus import ProfilerMetrics
from specrouter.profiler.resilient import ResilientMetrics
from specrouter.prometheus import RpcMetrics, new_registry, serve_metrics
from specrouter.router.admission import Admission
from specrouter.router.prometheus import RouterMetrics
from tests.metrics.scrape import scrape


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FlakyStore(MemoryStore):
    """A memory store that is unreachable while `down`."""

    def __init__(self) -> None:
        super().__init__(0.1)
        self.down = False

    def records(self):
        if self.down:
            raise StoreUnavailable("connection refused")
        return super().records()


def test_services_in_one_process_keep_their_series_apart():
    first, second = RouterMetrics(Admission(4, 4)), RouterMetrics(Admission(4, 4))
    first.tokens.inc(3)
    assert first.registry.get_sample_value("specrouter_router_generated_tokens_total") == 3
    assert second.registry.get_sample_value("specrouter_router_generated_tokens_total") == 0
    ProfilerMetrics(), ProfilerMetrics()
    assert REGISTRY.get_sample_value("specrouter_router_generated_tokens_total") is None


def test_series_of_known_labels_exist_before_anything_happened():
    samples = ProfilerMetrics().registry.get_sample_value
    assert samples("specrouter_profiler_reports_total", {"outcome": "stored"}) == 0
    assert samples("specrouter_profiler_snapshots_total", {"freshness": "stale"}) == 0
    router = RouterMetrics(Admission(4, 4)).registry.get_sample_value
    assert router("specrouter_router_requests_finished_total", {"finish_reason": "length"}) == 0


def test_in_flight_and_queued_are_read_from_admission_at_each_scrape():
    admission = Admission(max_in_flight=1, max_queued=4)
    metrics = RouterMetrics(admission)
    place = admission.enter()
    assert metrics.registry.get_sample_value("specrouter_router_requests_in_flight") == 1
    place.release()
    assert metrics.registry.get_sample_value("specrouter_router_requests_in_flight") == 0


def test_a_negative_metrics_port_serves_nothing_and_zero_a_free_port():
    registry = new_registry()
    assert serve_metrics(registry, "127.0.0.1", -1) is None
    endpoint = serve_metrics(registry, "127.0.0.1", 0)
    try:
        assert endpoint.url.startswith("http://127.0.0.1:") and endpoint.url.endswith("/metrics")
        assert "process_resident_memory_bytes" in scrape(endpoint.url).names()
    finally:
        endpoint.close()


def test_the_profiler_reports_how_stale_its_snapshots_are_while_its_store_is_down():
    clock, store, exported = Clock(), FlakyStore(), ProfilerMetrics()
    metrics = ResilientMetrics(store, retry_s=1.0, clock=clock)
    exported.watch(metrics)
    value = exported.registry.get_sample_value
    assert not metrics.snapshot().stale
    assert (value("specrouter_profiler_store_up"), value("specrouter_profiler_store_staleness_seconds")) == (1, 0)
    clock.now += 5
    store.down = True
    assert metrics.snapshot().stale
    clock.now += 7
    assert value("specrouter_profiler_store_up") == 0
    assert value("specrouter_profiler_store_staleness_seconds") == 12   # since the last answer, 5 s before the outage
    store.down = False
    clock.now += 1
    assert not metrics.snapshot().stale
    assert (value("specrouter_profiler_store_up"), value("specrouter_profiler_store_staleness_seconds")) == (1, 0)


def test_calls_are_counted_by_method_and_the_status_they_ended_with():
    registry = new_registry()
    rpc = RpcMetrics(registry)

    def unary(request, context):
        if request == b"refuse":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused")
        if request == b"crash":
            raise RuntimeError("a bug")
        return request

    def stream(request, context):
        yield request
        yield request

    handlers = {"Echo": grpc.unary_unary_rpc_method_handler(unary),
                "Stream": grpc.unary_stream_rpc_method_handler(stream)}
    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=[rpc])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary("/test.Echo/Echo")
            assert echo(b"hi", timeout=10) == b"hi"
            for request, code in ((b"refuse", grpc.StatusCode.FAILED_PRECONDITION), (b"crash", grpc.StatusCode.UNKNOWN)):
                with pytest.raises(grpc.RpcError) as failed:
                    echo(request, timeout=10)
                assert failed.value.code() == code
            assert list(channel.unary_stream("/test.Echo/Stream")(b"x", timeout=10)) == [b"x", b"x"]
            with pytest.raises(grpc.RpcError):   # a method no handler serves is not counted
                channel.unary_unary("/test.Echo/Missing")(b"", timeout=10)
    finally:
        server.stop(None)

    def handled(method, code):
        return registry.get_sample_value("specrouter_grpc_server_handled_total",
                                         {"grpc_service": "test.Echo", "grpc_method": method, "grpc_code": code})

    assert [handled("Echo", c) for c in ("OK", "FAILED_PRECONDITION", "UNKNOWN")] == [1, 1, 1]
    assert handled("Stream", "OK") == 1
    assert registry.get_sample_value("specrouter_grpc_server_handling_seconds_count",
                                     {"grpc_service": "test.Echo", "grpc_method": "Echo"}) == 3


def test_a_restarted_service_keeps_its_metrics_port():
    args = ["--model-dir", "m", "--port", "50052"]
    assert with_port(args, "9464", "--metrics-port") == [*args, "--metrics-port", "9464"]
    assert with_port([*args, "--metrics-port", "0"], "9464", "--metrics-port") == [*args, "--metrics-port", "9464"]
