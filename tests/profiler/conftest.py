"""Stores and profiler servers on port 0 for the profiler's tests (Redis comes from tests/redis_server.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest

from specrouter.profiler.memory_store import MemoryStore
from specrouter.profiler.redis_store import RedisStore
from specrouter.profiler.server import create_server
from specrouter.profiler.settings import ProfilerSettings
from specrouter.profiler.store import MetricStore
from specrouter.v1 import profiler_pb2_grpc
from tests.redis_server import RedisServer


@pytest.fixture
def key_prefix() -> str:
    return f"test:{uuid.uuid4().hex[:12]}"


def settings(**overrides: object) -> ProfilerSettings:
    values: dict = dict(host="127.0.0.1", port=0, ema_alpha=0.1, store_retry_s=0.0, redis_timeout_s=0.5)
    return ProfilerSettings(**(values | overrides))


def redis_store(url: str, key_prefix: str, alpha: float = 0.1) -> RedisStore:
    return RedisStore.from_url(url, alpha, key_prefix, timeout_s=0.5)


@pytest.fixture
def make_store(shared_redis: RedisServer, key_prefix: str) -> Iterator[Callable[[str], MetricStore]]:
    """`make_store("memory")` or `make_store("redis")` (on the shared Redis, under this test's prefix)."""
    stores: list[MetricStore] = []

    def make(kind: str) -> MetricStore:
        store = MemoryStore(0.1) if kind == "memory" else redis_store(shared_redis.url, key_prefix)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., str]]:
    """`serve(store, **settings)` starts a profiler on a free port and returns its address."""
    servers: list[grpc.Server] = []

    def start(store: MetricStore, **overrides: object) -> str:
        server, port = create_server(settings(**overrides), store)
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(None)


@pytest.fixture
def connect() -> Iterator[Callable[..., object]]:
    """`connect(address, stub_class=ProfilerServiceStub)`: a stub on a new channel of its own."""
    channels: list[grpc.Channel] = []

    def open_stub(address: str, stub_class: type = profiler_pb2_grpc.ProfilerServiceStub) -> object:
        channels.append(grpc.insecure_channel(address))
        return stub_class(channels[-1])

    yield open_stub
    for channel in channels:
        channel.close()
