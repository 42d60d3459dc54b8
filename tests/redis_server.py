"""Real Redis servers for tests: a Redis container when a Docker engine is reachable, else a
`redis-server` process of our own on a free port in a temporary directory (no persistence). Either can
be killed and started again on the same port. Tests never touch a Redis they did not start; in CI
(`CI` set) a missing Redis fails the run instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest
import redis

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
        message = "needs redis-server on PATH or a reachable Docker engine"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
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
