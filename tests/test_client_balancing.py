"""The SDK balances over routers: a target that names several addresses gets calls round robin (gRPC's own
default would send every call to the first), and `dns:///HOST:PORT` targets resolve. The routers are stand-ins
that count the calls they answer, on port 0."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from specrouter.client import Client, ModelInfo
from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc

CALLS = 20


class CountingRouter(router_pb2_grpc.RouterServiceServicer):
    def __init__(self, name: str):
        self.name, self.calls = name, 0

    def ListModels(self, request, context):
        self.calls += 1
        return pb.ListModelsResponse(models=[pb.ModelInfo(name=self.name, role="target")])


@pytest.fixture()
def routers():
    started = []
    for name in ("a", "b"):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        router = CountingRouter(name)
        router_pb2_grpc.add_RouterServiceServicer_to_server(router, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append((server, router, port))
    yield [(router, port) for _, router, port in started]
    for server, _, _ in started:
        server.stop(0)


def test_calls_are_spread_round_robin_over_every_router_the_target_names(routers) -> None:
    (a, port_a), (b, port_b) = routers
    with Client(f"ipv4:127.0.0.1:{port_a},127.0.0.1:{port_b}", timeout_s=10) as client:
        answered = [client.models()[0].name for _ in range(CALLS)]
    assert a.calls + b.calls == CALLS and a.calls and b.calls, (a.calls, b.calls)
    # once both connections are up, the calls alternate
    assert all(x != y for x, y in zip(answered[-6:], answered[-5:])), answered


def test_a_dns_target_resolves_and_serves(routers) -> None:
    (a, port), _ = routers
    with Client(f"dns:///localhost:{port}", timeout_s=10) as client:
        assert client.models() == [ModelInfo("a", 0, "target", "")]
    assert a.calls == 1
