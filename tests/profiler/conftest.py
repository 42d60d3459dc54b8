"""Real Redis servers for the profiler's tests, and profiler servers on port 0.

Redis is a Redis container when a Docker engine is reachable, else a `redis-server` process of our own on a
free port in a temporary directory (no persistence). Either can be killed and started again on the same
port. Tests never touch a Redis they did not start.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import grpc
import pytest
import redis

from specrouter.profiler.memory_store import MemoryStore
from specrouter.profiler.redis_store import RedisStore
from specrouter.profiler.server import create_server
from specrouter.profiler.settings import ProfilerSettings
from specrouter.profiler.store import MetricStore
from specrouter.v1 import profiler_pb2_grpc

REDIS_IMAGE = "redis:7-alpine"
REDIS_ARGS = ("--save", "", "--appendonly", "no")
START_TIMEOUT_S = 10.0


class RedisServer(Protocol):
    url: str

    def start(self) -> None: ...

    def kill(self) -> None: ...


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.2)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
        finally:
            client.close()


class RedisProcess:
    """`redis-server` on a free port, working in `workdir`."""

    def __init__(self, workdir: Path):
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self._workdir),
             "--logfile", str(self._workdir / "redis.log"), *REDIS_ARGS],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_until_up(self.url)

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()


class RedisInContainer:
    """A Redis container whose port is bound to a fixed host port, so it survives a kill and restart."""

    def __init__(self) -> None:
        try:
            from testcontainers.community.redis import RedisContainer
        except ImportError:
            from testcontainers.redis import RedisContainer

        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._container = (RedisContainer(REDIS_IMAGE).with_bind_ports(6379, self.port)
                           .with_command(["redis-server", *REDIS_ARGS]))
        self._started = False

    def start(self) -> None:
        if self._started:
            self._container.get_wrapped_container().start()
        else:
            self._container.start()
            self._started = True
        _wait_until_up(self.url)

    def kill(self) -> None:
        self._container.get_wrapped_container().kill()

    def remove(self) -> None:
        self._container.stop()


def _docker_reachable() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def redis_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], RedisServer]]:
    """Starts a fresh Redis per call; all are removed at the end of the session."""
    use_docker = _docker_reachable()
    if not use_docker and shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH or a reachable Docker engine")
    started: list[RedisServer] = []

    def start() -> RedisServer:
        server = RedisInContainer() if use_docker else RedisProcess(tmp_path_factory.mktemp("redis"))
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.kill()
        if isinstance(server, RedisInContainer):
            server.remove()


@pytest.fixture(scope="session")
def shared_redis(redis_factory: Callable[[], RedisServer]) -> RedisServer:
    """One Redis for the tests that do not stop it; each test uses its own key prefix."""
    return redis_factory()


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
