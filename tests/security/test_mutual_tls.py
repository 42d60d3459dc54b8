"""Workers and the profiler over mutual TLS: the router's certificate gets in; plaintext, no certificate,
or a certificate from another CA does not. Real servers in this process, on port 0."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrouter.healthcheck import check
from specrouter.profiler.server import create_server
from specrouter.profiler.settings import ProfilerSettings
from specrouter.profiler.store import open_store
from specrouter.router.measurements import SnapshotCache
from specrouter.tls import ClientTLS, channel
from specrouter.v1 import profiler_pb2, profiler_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.security.conftest import mutual_tls, router_client_tls, rpc_code

CALL_TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def profiler(pki) -> Iterator[str]:
    settings = ProfilerSettings(host="127.0.0.1", port=0)
    store = open_store(settings)
    server, port = create_server(settings, store, tls=mutual_tls(pki))
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)
    store.close()


def strangers(pki) -> dict[str, ClientTLS | None]:
    """Clients that must be refused: plaintext, TLS without a certificate, a certificate of another CA."""
    return {"plaintext": None, "no certificate": ClientTLS.from_files(pki.ca),
            "another CA": ClientTLS.from_files(pki.ca, pki.other_client_cert, pki.other_client_key)}


def test_the_profiler_serves_the_router_alone(pki, profiler) -> None:
    def snapshot(tls):
        with channel(profiler, tls) as ch:
            return rpc_code(lambda: profiler_pb2_grpc.ProfilerServiceStub(ch).Snapshot(
                profiler_pb2.SnapshotRequest(), timeout=CALL_TIMEOUT_S))

    assert snapshot(router_client_tls(pki)) == grpc.StatusCode.OK
    for who, tls in strangers(pki).items():
        assert snapshot(tls) == grpc.StatusCode.UNAVAILABLE, who


def test_the_routers_snapshot_cache_reads_a_tls_profiler(pki, profiler) -> None:
    with_tls, without = SnapshotCache(profiler, tls=router_client_tls(pki)), SnapshotCache(profiler)
    with_tls.refresh()
    without.refresh()
    assert with_tls.get()[0] is not None and without.get()[0] is None


def test_a_worker_serves_the_router_alone(pki, tls_workers) -> None:
    def info(tls):
        with channel(tls_workers[0], tls) as ch:
            return rpc_code(lambda: worker_pb2_grpc.WorkerServiceStub(ch).Info(worker_pb2.InfoRequest(),
                                                                              timeout=CALL_TIMEOUT_S))

    assert info(router_client_tls(pki)) == grpc.StatusCode.OK
    for who, tls in strangers(pki).items():
        assert info(tls) == grpc.StatusCode.UNAVAILABLE, who


def test_health_over_mutual_tls(pki, tls_workers) -> None:
    """Health sits behind the same TLS: a probe needs the client certificate too."""
    assert check(tls_workers[1], tls=router_client_tls(pki), timeout_s=CALL_TIMEOUT_S).serving
    refused = check(tls_workers[1], timeout_s=CALL_TIMEOUT_S)
    assert not refused.serving and "unreachable" in refused.reason
    with channel(tls_workers[1], ClientTLS.from_files(pki.ca)) as ch:
        code = rpc_code(lambda: health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                                     timeout=CALL_TIMEOUT_S))
    assert code == grpc.StatusCode.UNAVAILABLE
