"""A model other than the target fails: its batch drops it and goes on, the output stays the target's."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time

import pytest

from specrouter.client import Client, UnavailableError

from specrouter.router.batcher import Batcher
from specrouter.router.handles import Failed, Finished
from specrouter.worker.engine import WorkerEngine
from specrouter.worker.forward import ModelForward
from tests.conftest import DEMO_POOL, tiny_llama
from specrouter.router.health import ModelUnavailable
from specrouter.router.requests import GenerationRequest
from specrouter.contract.calls import SamplingParams

CONTEXT = 256
TARGET_SHAPE = (3, 64, 2)   # the tiny pool's target: seed, hidden size, layers (tests/conftest.py)
PROMPTS = [[5, 9, 3, 17, 2], [7, 1, 40, 22]]
NEW = 24


class Down(RuntimeError):
    """What a call to a worker that is gone raises (the gRPC error, in process)."""


def outcome(handle, timeout: float = 120.0):
    while True:
        event = handle.events.get(timeout=timeout)
        if isinstance(event, (Failed, Finished)):
            return event


def run(batcher: Batcher, prompt, chain=None, window=0) -> Finished | Failed:
    return outcome(batcher.submit(GenerationRequest(prompt, SamplingParams(), NEW, chain=chain, window=window)))


class Prefer:
    """A chooser that takes the first of `chains` whose models the batch still has (at a window of 3, where
    the requests named none)."""

    def __init__(self, *chains: tuple[str, ...]):
        self.chains = chains

    def choose(self, batch, chain, window):
        if chain is not None:
            return chain, window or 3
        return next(c for c in self.chains if set(c) <= set(batch.workers)), 3


@contextlib.contextmanager
def started(pool, *chains):
    """A running batcher over `pool` whose router prefers `chains` in order."""
    batcher = Batcher(pool, "t", CONTEXT, None, chooser=Prefer(*chains))
    batcher.start()
    try:
        yield batcher
    finally:
        batcher.stop()


@pytest.fixture()
def pool(tiny_pool):
    saved = {name: dict(vars(engine)) for name, engine in tiny_pool.items()}
    yield tiny_pool
    for name, engine in tiny_pool.items():   # undo the failures a test put in
        for attr in ("draft", "verify", "prefill", "probe"):
            if attr in vars(engine) and attr not in saved[name]:
                delattr(engine, attr)
        for state in engine.state_ids():   # a model dropped from a batch keeps its rows until their TTL
            engine.release(state)


@pytest.fixture()
def reference(pool) -> list[list[int]]:
    with started(pool, ("t",)) as batcher:
        return [run(batcher, p, chain=("t",)).token_ids for p in PROMPTS]


def fail_after(engine, method: str, calls: int) -> None:
    """`engine.method` answers `calls` times, then raises as a worker that went away."""
    real, count = getattr(engine, method), [0]

    def failing(*args, **kwargs):
        count[0] += 1
        if count[0] > calls:
            raise Down(f"{engine.name} is gone")
        return real(*args, **kwargs)

    setattr(engine, method, failing)


def still_down(engine) -> None:
    def probe():
        raise Down(f"{engine.name} does not answer")
    engine.probe = probe


def test_a_drafter_failing_mid_request_leaves_the_output_exact(pool, reference) -> None:
    fail_after(pool["s"], "draft", 3)
    still_down(pool["s"])
    with started(pool, ("s", "t"), ("m", "t"), ("t",)) as batcher:
        first = run(batcher, PROMPTS[0])
        assert isinstance(first, Finished), first
        assert first.token_ids == reference[0]
        assert first.stats["chain_counts"]["s,t"] == 3 and first.stats["chain_counts"]["m,t"] > 0
        assert "s" in batcher.health.down() and "gone" in batcher.health.down()["s"]
        # a new request starts without it; one that names a chain through it is refused, by name
        second = run(batcher, PROMPTS[1])
        assert isinstance(second, Finished) and second.token_ids == reference[1]
        assert set(second.stats["chain_counts"]) == {"m,t"}
        named = run(batcher, PROMPTS[1], chain=("s", "t"), window=2)
        assert isinstance(named, Failed) and isinstance(named.error, ModelUnavailable)
        assert "model s" in str(named.error) and "auto" in str(named.error)
        # its worker answers again: the next batch has it back
        del pool["s"].draft, pool["s"].probe
        batcher.health.probe_once()
        assert batcher.health.down() == {}
        third = run(batcher, PROMPTS[1])
        assert third.token_ids == reference[1] and set(third.stats["chain_counts"]) == {"s,t"}


def test_an_intermediate_verifier_failing_after_the_draft_rolls_the_drafter_back(pool, reference) -> None:
    """s drafts, then m's verification fails: s cached the cycle's proposal, which must be rolled back
    before s drafts for the target alone. Here s is a copy of the target, so with its state right every
    token it drafts is accepted; a proposal left in its cache would put it off."""
    twin = {**pool, "s": WorkerEngine("s", ModelForward(tiny_llama(*TARGET_SHAPE)))}
    fail_after(twin["m"], "verify", 2)
    still_down(twin["m"])
    with started(twin, ("s", "m", "t"), ("s", "t"), ("t",)) as batcher:
        handles = [batcher.submit(GenerationRequest(p, SamplingParams(), NEW)) for p in PROMPTS]
        done = [outcome(h) for h in handles]
        assert all(isinstance(d, Finished) for d in done), done
        assert [d.token_ids for d in done] == reference
        assert done[0].stats["chain_counts"]["s,m,t"] == 2 and done[0].stats["chain_counts"]["s,t"] > 0
        for h in handles:
            after = h.accepted["t"][2:]   # the target's accepted tokens per cycle once m is out
            assert after and all(a == 3 for a in after[:-1]), h.accepted["t"]


def test_a_model_failing_the_prefill_is_left_out_and_the_prefill_redone(pool, reference) -> None:
    fail_after(pool["m"], "prefill", 0)
    still_down(pool["m"])
    with started(pool, ("m", "t"), ("s", "t"), ("t",)) as batcher:
        done = run(batcher, PROMPTS[0])
        assert isinstance(done, Finished) and done.token_ids == reference[0]
        assert set(done.stats["chain_counts"]) == {"s,t"} and "m" in batcher.health.down()


def test_a_failing_target_fails_the_requests_and_stays_in(pool) -> None:
    fail_after(pool["t"], "verify", 1)
    with started(pool, ("s", "t"), ("t",)) as batcher:
        failed = run(batcher, PROMPTS[0])
        assert isinstance(failed, Failed) and "t is gone" in str(failed.error)
        assert batcher.health.down() == {}


# -- over the wire: a worker process killed and started again ---------------------------------------

def _start(args: list[str], ready: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if ready in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()   # keep its pipe drained
            return proc, line.split()[-1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"{args[0]} did not start")


def _worker(model: str, port: int = 0) -> tuple[subprocess.Popen, str]:
    return _start(["specrouter.worker", "--model-dir", str(DEMO_POOL / model), "--name", model,
                   "--port", str(port)], "listening on")


def test_a_killed_drafter_worker_leaves_the_router_serving_and_rejoins_when_restarted() -> None:
    procs = []
    try:
        drafter, drafter_at = _worker("stdlib-1m")
        target, target_at = _worker("stdlib-29m")
        procs += [drafter, target]
        router, router_at = _start(["specrouter.router", "--workers", f"{drafter_at},{target_at}",
                                    "--tokenizer-dir", str(DEMO_POOL / "stdlib-29m"), "--target", "stdlib-29m",
                                    "--port", "0"], "router listening on")
        procs.append(router)
        with Client(router_at, timeout_s=120) as client:
            prompt = "def parse(path):"
            expected = client.generate(prompt, max_new_tokens=24, chain="target").token_ids
            assert client.generate(prompt, max_new_tokens=24, chain="stdlib-1m,stdlib-29m").token_ids == expected
            drafter.kill()
            drafter.wait(30)
            served = client.generate(prompt, max_new_tokens=24)
            # the chains left: the target's, alone or behind the lookup (which runs in the router)
            assert served.token_ids == expected and served.stats.chain_counts
            assert set(served.stats.chain_counts) <= {"stdlib-29m", "lookup,stdlib-29m"}
            with pytest.raises(UnavailableError) as err:
                client.generate(prompt, max_new_tokens=4, chain="stdlib-1m,stdlib-29m")
            assert "stdlib-1m" in err.value.message and "auto" in err.value.message
            drafter, _ = _worker("stdlib-1m", int(drafter_at.rsplit(":", 1)[1]))
            procs.append(drafter)
            deadline = time.monotonic() + 30
            while True:   # the router's probe finds it again within about a second
                try:
                    again = client.generate(prompt, max_new_tokens=24, chain="stdlib-1m,stdlib-29m")
                    break
                except UnavailableError:
                    assert time.monotonic() < deadline, "the restarted drafter was never used again"
                    time.sleep(0.5)
            assert again.token_ids == expected and set(again.stats.chain_counts) == {"stdlib-1m,stdlib-29m"}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
