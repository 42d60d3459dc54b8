"""`specrouter healthcheck` against real servers on port 0: SERVING exits 0; anything else exits 1 with
a one-line reason."""

from __future__ import annotations

import socket
import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from typer.testing import CliRunner

from specrouter import serving
from specrouter.cli import app
from specrouter.healthcheck import check
from specrouter.profiler.server import SERVICE_NAME as PROFILER_SERVICE
from specrouter.profiler.server import create_server, shutdown
from specrouter.profiler.settings import ProfilerSettings
from specrouter.profiler.store import open_store

runner = CliRunner()


@pytest.fixture
def profiler():
    """A real profiler (metrics in memory) on a free port, and its health servicer."""
    from grpc_health.v1 import health

    health_servicer = health.HealthServicer()
    server, port = create_server(ProfilerSettings(host="127.0.0.1", port=0), open_store(ProfilerSettings()),
                                 health_servicer)
    server.start()
    yield f"127.0.0.1:{port}", server, health_servicer
    server.stop(0)


@pytest.fixture
def bare_server():
    """A gRPC server with nothing on it yet; the test adds services, then starts it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    port = serving.listen(server, "127.0.0.1", 0)
    yield server, f"127.0.0.1:{port}"
    server.stop(0)


@pytest.fixture
def closed_port():
    """A port that nothing listens on: bound (so no one else takes it) but never listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def run_cli(*args: str):
    result = runner.invoke(app, ["healthcheck", *args])
    return result.exit_code, result.output.strip()


def test_serving_server_exits_0(profiler):
    address, _, _ = profiler
    code, out = run_cli(address, "--timeout", "5")
    assert (code, out) == (0, f"{address}: SERVING")


def test_named_service_serving_and_unknown(profiler):
    address, _, _ = profiler
    assert run_cli(address, "--service", PROFILER_SERVICE) == (0, f"service {PROFILER_SERVICE!r} at {address}: SERVING")
    code, out = run_cli(address, "--service", "no.such.Service")
    assert code == 1
    assert out == f"service 'no.such.Service' at {address}: the server does not know this service name"


def test_server_shutting_down_exits_1(profiler):
    address, server, health_servicer = profiler
    health_servicer.enter_graceful_shutdown()   # what the profiler's shutdown does first
    code, out = run_cli(address)
    assert (code, out) == (1, f"{address} is NOT_SERVING")


def test_not_serving_yet_exits_1(bare_server):
    """A worker's health until its model is warmed up."""
    server, address = bare_server
    health_servicer = serving.add_health_and_reflection(server, "specrouter.v1.WorkerService", serving=False)
    server.start()
    assert run_cli(address) == (1, f"{address} is NOT_SERVING")
    serving.set_serving(health_servicer, "specrouter.v1.WorkerService", True)
    assert run_cli(address) == (0, f"{address}: SERVING")


def test_server_without_health_service_exits_1(bare_server):
    server, address = bare_server
    server.start()
    assert run_cli(address) == (1, f"{address} has no gRPC health service")


def test_closed_port_exits_1_with_a_reason(closed_port):
    address = f"127.0.0.1:{closed_port}"
    code, out = run_cli(address, "--timeout", "5")
    assert code == 1
    assert out.startswith(f"{address} is unreachable (")
    assert len(out.splitlines()) == 1


def test_check_says_the_same_without_the_cli(profiler, closed_port):
    address, _, _ = profiler
    assert check(address).serving
    closed = check(f"127.0.0.1:{closed_port}", timeout_s=5)
    assert not closed.serving and "unreachable" in closed.reason


def test_the_installed_command_as_a_container_healthcheck_runs_it(profiler, closed_port):
    """A process of its own, as `docker compose` runs it: the exit code is what counts."""
    address, server, _ = profiler
    ok = subprocess.run([sys.executable, "-m", "specrouter.cli", "healthcheck", address],
                        capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stdout.strip()) == (0, f"{address}: SERVING")
    down = subprocess.run([sys.executable, "-m", "specrouter.cli", "healthcheck", f"127.0.0.1:{closed_port}"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and down.stdout == ""
    assert "is unreachable" in down.stderr and len(down.stderr.strip().splitlines()) == 1


def test_profiler_shutdown_turns_the_check_to_1(profiler):
    address, server, health_servicer = profiler
    shutdown(server, health_servicer, grace_s=0)
    code, out = run_cli(address, "--timeout", "2")
    assert code == 1 and out.startswith(address)


def test_a_gateways_url_is_checked_over_http(bare_server, closed_port):
    """The gateway's /health answers 200 while its router serves, 503 (and why) while none does."""
    from tests.gateway.conftest import InProcessGateway

    server, address = bare_server
    serving.add_health_and_reflection(server, "specrouter.v1.RouterService", serving=True)
    server.start()
    with InProcessGateway(router=address) as gateway:
        code, said = run_cli(f"{gateway.url}/health", "--timeout", "5")
    assert code == 0 and said == f"{gateway.url}/health: 200"
    with InProcessGateway(router=f"127.0.0.1:{closed_port}") as gateway:
        code, said = run_cli(f"{gateway.url}/health", "--timeout", "5")
    assert code == 1 and f"{gateway.url}/health answered 503: the router at 127.0.0.1:{closed_port} does not " \
        "serve" in said
    code, said = run_cli(f"http://127.0.0.1:{closed_port}/health", "--timeout", "2")
    assert code == 1 and "is unreachable" in said
