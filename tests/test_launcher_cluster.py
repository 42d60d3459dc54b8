"""`specrouter up` on the demo pool keeps serving through kill -9 of a drafter's worker and of the router:
each comes back on its address, the router uses the drafter again, and greedy output stays the target's."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrouter.client import Client, SpecRouterError, UnavailableError
from tests.conftest import DEMO_POOL

DRAFTER, TARGET = "stdlib-1m", "stdlib-29m"
PROMPT = "def parse(path):"
NEW_TOKENS = 32
WAIT_S = 300.0   # bound on start-ups and restarts on a loaded machine (not a timing assertion)


class Up:
    """`specrouter up` as a child process, its stdout and stderr read line by line."""

    def __init__(self, log_dir):
        self.proc = subprocess.Popen([sys.executable, "-m", "specrouter.cli", "up", "--pool", str(DEMO_POOL),
                                      "--port", "0", "--log-dir", str(log_dir)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._new: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self._new.put(line)

    def wait_for(self, text: str) -> str:
        """The first line, from now on, that holds `text`."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                line = self._new.get(timeout=1.0)
            except queue.Empty:
                assert self.proc.poll() is None, "".join(self.lines[-40:])
                continue
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r}; the last lines:\n{''.join(self.lines[-40:])}")

    def child(self, *words: str) -> int:
        """The pid of the child whose command line holds every one of `words`."""
        for pid in subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if all(w.encode() in args for w in words):
                return int(pid)
        raise AssertionError(f"no child with {words}")


def retry_unavailable(call):
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return call()
        except UnavailableError:
            assert time.monotonic() < deadline
            time.sleep(0.5)


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.slow
def test_up_restarts_a_killed_drafter_and_router_on_their_addresses(tmp_path) -> None:
    up = Up(tmp_path / "logs")
    try:
        drafter_at = up.wait_for(f"worker-{DRAFTER} up at ").split()[-1]
        router_at = up.wait_for("router listening on ").split()[-1]
        with Client(router_at, timeout_s=120) as client:
            expected = client.generate(PROMPT, max_new_tokens=NEW_TOKENS, chain="target").token_ids
            assert client.generate(PROMPT, max_new_tokens=NEW_TOKENS, chain=f"{DRAFTER},{TARGET}").token_ids == expected

            # requests run all along, on the router's choice of chain: each must be the target's output
            outputs, failures, done = [], [], threading.Event()

            def keep_asking() -> None:
                while not done.is_set():
                    try:
                        outputs.append(client.generate(PROMPT, max_new_tokens=NEW_TOKENS).token_ids)
                    except SpecRouterError as exc:
                        failures.append(exc)

            asking = threading.Thread(target=keep_asking)
            asking.start()
            try:
                drafter_pid = up.child("--name", DRAFTER)
                os.kill(drafter_pid, signal.SIGKILL)
                said = up.wait_for(f"worker-{DRAFTER} exited with code -9 (SIGKILL); starting it again on {drafter_at}")
                assert f"worker-{DRAFTER}.log" in said
                up.wait_for(f"worker-{DRAFTER} is back at {drafter_at} (restart 1)")
                assert up.child("--name", DRAFTER) != drafter_pid and serving(drafter_at)
                # the router's probe finds it again: a request through it is served, not refused
                again = retry_unavailable(lambda: client.generate(PROMPT, max_new_tokens=NEW_TOKENS,
                                                                  chain=f"{DRAFTER},{TARGET}"))
                assert again.token_ids == expected and set(again.stats.chain_counts) == {f"{DRAFTER},{TARGET}"}
            finally:
                done.set()
                asking.join(WAIT_S)
            assert not failures and outputs and all(o == expected for o in outputs), (failures, len(outputs))

            router_pid = up.child("specrouter.router")
            os.kill(router_pid, signal.SIGKILL)
            up.wait_for(f"router exited with code -9 (SIGKILL); starting it again on {router_at}")
            up.wait_for(f"router is back at {router_at} (restart 1)")
            assert up.child("specrouter.router") != router_pid
            back = retry_unavailable(lambda: client.generate(PROMPT, max_new_tokens=NEW_TOKENS))
            assert back.token_ids == expected
        children = subprocess.run(["pgrep", "-P", str(up.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 5   # profiler, three workers, router
        up.proc.send_signal(signal.SIGTERM)
        assert up.proc.wait(120) == 0
        for pid in children:
            assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()
    finally:
        if up.proc.poll() is None:
            up.proc.send_signal(signal.SIGTERM)   # it stops its services
            try:
                up.proc.wait(120)
            except subprocess.TimeoutExpired:
                up.proc.kill()
