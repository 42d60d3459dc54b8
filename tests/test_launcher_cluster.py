"""`specrouter up` on the demo pool keeps serving through kill -9 of each of its processes in turn: the drafter's
worker (no request lost, the drafter used again once back), the profiler (none lost, measurements again once
back), the target's worker (the requests in flight wait for it, join again from their tokens and finish) and
the router (back on its address). Greedy output stays the target's throughout."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrouter.client import Client, SpecRouterError, UnavailableError
from tests.conftest import DEMO_POOL
from tests.router.test_services import profiler_snapshot

DRAFTER, TARGET = "stdlib-1m", "stdlib-29m"
PROMPT = "def parse(path):"
NEW_TOKENS = 32
LONG_TOKENS, LONG_REQUESTS = 300, 6   # requests in flight when the target's worker is killed
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

    def address_of(self, service: str) -> str:
        """The address `service` was announced at (its `up at` line, printed before the router's)."""
        return next(line.split()[-1] for line in self.lines if line.startswith(f"{service} up at "))

    def child(self, *words: str) -> int:
        """The pid of the child whose command line holds every one of `words`."""
        for pid in subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            if all(w.encode() in args for w in words):
                return int(pid)
        raise AssertionError(f"no child with {words}")


class Asking:
    """Requests one after another on a thread (the router's choice of chain) while the block runs; their
    outputs and failures. Leaving the block waits for the request in flight: one that hangs fails the test."""

    def __init__(self, client: Client):
        self.client = client
        self.outputs: list[list[int]] = []
        self.failures: list[SpecRouterError] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._ask, daemon=True)

    def _ask(self) -> None:
        while not self._done.is_set():
            try:
                self.outputs.append(self.client.generate(PROMPT, max_new_tokens=NEW_TOKENS).token_ids)
            except SpecRouterError as exc:
                self.failures.append(exc)

    def wait_for_outputs(self, count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(self.outputs) < count:
            assert time.monotonic() < deadline, f"{len(self.outputs)} outputs; failures: {self.failures}"
            time.sleep(0.1)

    def __enter__(self) -> Asking:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "a request hung"


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
    log_dir = tmp_path / "logs"
    up = Up(log_dir)
    try:
        router_at = up.wait_for("router listening on ").split()[-1]
        profiler_at, drafter_at, target_at = (up.address_of(name) for name in ("profiler", f"worker-{DRAFTER}",
                                                                                f"worker-{TARGET}"))
        with Client(router_at, timeout_s=120) as client:
            expected = client.generate(PROMPT, max_new_tokens=NEW_TOKENS, chain="target").token_ids
            assert client.generate(PROMPT, max_new_tokens=NEW_TOKENS, chain=f"{DRAFTER},{TARGET}").token_ids == expected

            # requests run all along, on the router's choice of chain: each must be the target's output
            with Asking(client) as asking:
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
            assert not asking.failures and asking.outputs, (asking.failures, len(asking.outputs))
            assert all(o == expected for o in asking.outputs)

            # the profiler killed: the router serves on its last metrics, and reports to the profiler again
            # once it is back (in memory: it starts empty and fills up)
            with Asking(client) as asking:
                os.kill(up.child("specrouter.profiler"), signal.SIGKILL)
                up.wait_for(f"profiler exited with code -9 (SIGKILL); starting it again on {profiler_at}")
                up.wait_for(f"profiler is back at {profiler_at} (restart 1)")
                asking.wait_for_outputs(len(asking.outputs) + 2)
                snap = profiler_snapshot(profiler_at, lambda s: TARGET in {f.model for f in s.forward})
                assert TARGET in {f.model for f in snap.forward}   # the target runs in every chain
            assert not asking.failures and all(o == expected for o in asking.outputs), asking.failures

            # the target's worker killed while long requests run: they wait for it to come back, join again
            # from their tokens and finish with the target's output; none fails, none hangs
            long_expected = client.generate(PROMPT, max_new_tokens=LONG_TOKENS, chain="target").token_ids
            with futures.ThreadPoolExecutor(LONG_REQUESTS) as pool:
                streams = [pool.submit(lambda: client.generate(PROMPT, max_new_tokens=LONG_TOKENS))
                           for _ in range(LONG_REQUESTS)]
                time.sleep(1.0)
                assert not any(f.done() for f in streams), "the requests ended before the kill; make them longer"
                os.kill(up.child("--name", TARGET), signal.SIGKILL)
                up.wait_for(f"worker-{TARGET} exited with code -9 (SIGKILL); starting it again on {target_at}")
                up.wait_for(f"worker-{TARGET} is back at {target_at} (restart 1)")
                outputs = [f.result(WAIT_S).token_ids for f in streams]
            assert outputs == [long_expected] * LONG_REQUESTS
            router_log = (log_dir / "router.log").read_text()
            assert "wait for one to answer" in router_log and "answers again" in router_log

            router_pid = up.child("specrouter.router")
            os.kill(router_pid, signal.SIGKILL)
            up.wait_for(f"router exited with code -9 (SIGKILL); starting it again on {router_at}")
            up.wait_for(f"router is back at {router_at} (restart 1)")
            assert up.child("specrouter.router") != router_pid
            back = retry_unavailable(lambda: client.generate(PROMPT, max_new_tokens=NEW_TOKENS))
            assert back.token_ids == expected
        children = subprocess.run(["pgrep", "-P", str(up.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(children) == 6   # profiler, three workers, router, gateway
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
