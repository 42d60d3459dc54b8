"""The supervisor of `specrouter up`: a service that exits is started again on its port, after a backoff
that doubles while it keeps failing. Real child processes: this file, run as a module, is the service."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from specrouter.launcher import Backoff, ServiceProcess, Supervisor, exit_description, with_port

WAIT_S = 60.0   # bound on waiting for a child process to exit or to listen (not a timing assertion)


def fake_service(argv: list[str]) -> None:
    """Listens on --port and answers each connection with its pid; exits 3 at start while --fail-file exists."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fail-file", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.fail_file.exists():
        print("failing as asked", file=sys.stderr, flush=True)
        sys.exit(3)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", args.port))
    server.listen()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"fake listening on 127.0.0.1:{server.getsockname()[1]}", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(str(os.getpid()).encode())


def pid_at(address: str) -> int:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        return int(conn.recv(32))


def exited(service: ServiceProcess) -> int:
    return service.proc.wait(WAIT_S)


def step_until_back(supervisor: Supervisor, service: ServiceProcess, now: float) -> None:
    """Runs the supervisor's rounds at `now` until `service` serves again (bounded by WAIT_S of real time)."""
    deadline = time.monotonic() + WAIT_S
    while supervisor.due(service) is not None or not service.ready() or supervisor._watch[service.name].starting:
        assert time.monotonic() < deadline, f"{service.name} did not come back; its log:\n{service.log_tail()}"
        supervisor.step(now)
        time.sleep(0.05)


@pytest.fixture()
def fail_file(tmp_path) -> Path:
    return tmp_path / "fail"


@pytest.fixture()
def service(tmp_path, fail_file):
    s = ServiceProcess("tests.test_launcher", "--port", "0", "--fail-file", str(fail_file), log_dir=tmp_path / "logs",
                       name="fake")
    yield s
    s.stop()


def test_backoff_doubles_from_half_a_second_to_thirty() -> None:
    assert [Backoff().delay(n) for n in range(1, 10)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert Backoff(first_s=1.0, most_s=5.0).delay(100) == 5.0


def test_a_restart_takes_the_port_the_service_had() -> None:
    assert with_port(["--host", "h", "--port", "0", "--x"], "4321") == ["--host", "h", "--port", "4321", "--x"]
    assert with_port(["--name", "n"], "4321") == ["--name", "n", "--port", "4321"]
    assert exit_description(-9) == "code -9 (SIGKILL)" and exit_description(2) == "code 2"


def test_a_killed_service_is_started_again_on_its_port(service, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="specrouter.launcher")
    address, first_pid = service.address, pid_at(service.address)
    supervisor = Supervisor([service])
    supervisor.step(0.0)
    assert supervisor.due(service) is None   # serving: nothing to do
    os.kill(service.proc.pid, signal.SIGKILL)
    assert exited(service) == -signal.SIGKILL
    supervisor.step(10.0)
    assert supervisor.due(service) == 10.5
    supervisor.step(10.4)
    assert not service.alive() and service.restarts == 0   # not before its backoff
    step_until_back(supervisor, service, 10.5)
    assert service.restarts == 1 and service.address == address
    assert pid_at(address) == service.proc.pid != first_pid
    said = caplog.text
    assert "fake exited with code -9 (SIGKILL); starting it again on " + address + " in 0.5 s" in said
    assert str(service.log_path) in said and f"fake is back at {address} (restart 1)" in said
    text = service.log_path.read_text()   # the log keeps both runs
    assert text.count("fake listening on") == 2 and "--- restart 1: the last run exited with code -9 ---" in text


def test_a_service_that_keeps_failing_waits_twice_as_long_each_time(service, fail_file, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="specrouter.launcher")
    supervisor = Supervisor([service], Backoff(first_s=0.5, most_s=1.5, reset_after_s=100.0))
    fail_file.write_text("")
    service.proc.kill()
    exited(service)
    now, delays = 0.0, []
    for _ in range(3):   # exited, then twice "did not start again"
        supervisor.step(now)
        delays.append(supervisor.due(service) - now)
        now = supervisor.due(service)
        supervisor.step(now)   # starts it; it exits 3 at once
        assert exited(service) == 3
    assert delays == [0.5, 1.0, 1.5]
    assert caplog.text.count("fake did not start again with code 3") == 2 and "failing as asked" in caplog.text
    fail_file.unlink()
    supervisor.step(now)
    step_until_back(supervisor, service, supervisor.due(service))
    assert service.restarts == 4 and pid_at(service.address) == service.proc.pid
    # a run that stayed up past reset_after_s clears the failures before it: the next wait is the first again
    service.proc.kill()
    exited(service)
    later = supervisor._watch["fake"].up_since + 100.0
    supervisor.step(later)
    assert supervisor.due(service) == later + 0.5


def test_the_supervisor_stops_when_told_and_starts_nothing_after(service) -> None:
    import threading

    stop = threading.Event()
    supervisor = Supervisor([service])
    runner = threading.Thread(target=supervisor.run, args=(stop,))
    runner.start()
    stop.set()
    runner.join(WAIT_S)
    assert not runner.is_alive()
    assert service.stop() == 0 and service.restarts == 0   # SIGTERM: the fake exits 0


if __name__ == "__main__":
    fake_service(sys.argv[1:])
