"""A worker whose state of a batch no longer matches the router's rows costs time, never a request.

The faults: a release that fails (the worker keeps rows the router let go of), a drafter whose states are gone
(a restart, or its TTL) while the batch runs and a row joins, a target replica that goes silent and comes back
holding a state the batch moved away from, and a target with no replica answering for a while. Each time
every request finishes with the tokens it would have had, no model is taken out for it, and no worker keeps
a state.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from specrouter.router.batcher import Batcher
from specrouter.router.handles import Failed, Finished
from specrouter.router.health import ModelUnavailable
from specrouter.router.replicas import ReplicaSet
from specrouter.router.requests import GenerationRequest
from specrouter.contract.calls import SamplingParams
from tests.router.test_row_isolation import CONTEXT, PROMPTS, engine, outcome

NEW = [6, 20, 14, 20]   # request 0 finishes first, and its release is the one that fails
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=99)
PARAMS = [SamplingParams(), SamplingParams(), SAMPLED, SamplingParams()]
CHAIN = ("s", "t")


def requests(chain=CHAIN, window=3) -> list[GenerationRequest]:
    return [GenerationRequest(p, s, n, chain=chain, window=window) for p, s, n in zip(PROMPTS, PARAMS, NEW)]


@pytest.fixture()
def pool():
    return {name: engine(name) for name in ("s", "t")}


@contextlib.contextmanager
def running(workers, target_wait_s: float = 0.0, probe_s: float = 1.0):
    batcher = Batcher(workers, "t", CONTEXT, None, target_wait_s=target_wait_s)
    batcher.health.probe_s = probe_s
    try:
        yield batcher
    finally:
        batcher.stop()


def run(workers, reqs, target_wait_s: float = 0.0, during=None) -> list[Finished | Failed]:
    """The requests as one batch; `during(batcher, handles)` is called before the loop starts."""
    with running(workers, target_wait_s) as batcher:
        handles = [batcher.submit(r) for r in reqs]
        if during is not None:
            during(batcher, handles)
        batcher.start()
        done = [outcome(h) for h in handles]
        assert batcher.health.down() == {}, "a fault of a state took a model out of the pool"
    return done


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """The outputs with no fault, on the chain and window every test uses (a sampled row's tokens are
    reproducible for a given chain and window); the greedy ones are the target's own."""
    done = run({name: engine(name) for name in ("s", "t")}, requests())
    assert all(isinstance(d, Finished) for d in done), done
    return [d.token_ids for d in done]


def exact(done, reference) -> None:
    for i, d in enumerate(done):
        assert isinstance(d, Finished), f"request {i}: {d}"
        assert d.token_ids == reference[i], f"request {i}"


def no_states(engines) -> bool:
    return all(not e.state_ids() for e in engines)


def failing(engine, method: str, times: int, error=RuntimeError("the call was lost on its way")) -> list[int]:
    """`engine.method` raises `error` on its first `times` calls; how many calls it got."""
    real, calls = getattr(engine, method), [0]

    def call(*args, **kwargs):
        calls[0] += 1
        if calls[0] <= times:
            raise error
        return real(*args, **kwargs)

    setattr(engine, method, call)
    return calls


@pytest.mark.parametrize("model", ["s", "t"])
# once: sent again; twice: the state is rebuilt; three times (the rebuild's own release fails too): it is
# rebuilt under a fresh state id, the old one released later
@pytest.mark.parametrize("times", [1, 2, 3])
def test_a_release_that_fails_fails_no_request_and_leaves_no_state(pool, reference, model, times, caplog) -> None:
    calls = failing(pool[model], "release", times)
    with running(pool) as batcher:
        handles = [batcher.submit(r) for r in requests()]
        batcher.start()
        done = [outcome(h) for h in handles]
        assert batcher.health.down() == {}, "a fault of a state took a model out of the pool"
        deadline = time.monotonic() + 30
        while len(batcher.orphans) and time.monotonic() < deadline:   # the old state's release, sent again
            time.sleep(0.05)
    exact(done, reference)
    assert calls[0] > times
    assert no_states(pool.values())
    assert any(f"on {model} was rebuilt" in r.getMessage() for r in caplog.records) == (times >= 2)


def wipe_after(engine, on, method: str, calls: int, then=None) -> None:
    """After `on.method` has answered `calls` times, `engine` loses every state (a restart, or its TTL) and
    `then()` runs, still inside that call."""
    real, count = getattr(on, method), [0]

    def call(*args, **kwargs):
        out = real(*args, **kwargs)
        count[0] += 1
        if count[0] == calls:
            for state in engine.state_ids():
                engine.release(state)
            if then is not None:
                then()
        return out

    setattr(on, method, call)


@pytest.mark.parametrize("joins", [False, True])
def test_a_drafter_that_lost_its_state_is_rebuilt_and_ends_no_row(pool, reference, joins, caplog) -> None:
    """The drafter's states vanish mid-batch. With a row joining before the next draft, the drafter's prefill
    makes a fresh state holding that row alone, and the draft names rows it does not hold; without, the
    draft finds no state. Either way the drafter's state is rebuilt, it keeps drafting, and every request,
    the joining one included, finishes with its own tokens."""
    reqs = requests()
    late: list = []
    with running(pool) as batcher:
        join = (lambda: late.append(batcher.submit(reqs[3]))) if joins else None
        wipe_after(pool["s"], pool["t"], "verify", 2, then=join)
        handles = [batcher.submit(r) for r in reqs[:3]]
        batcher.start()
        done = [outcome(h) for h in handles + late]
        assert batcher.health.down() == {}
    exact(done, reference)
    assert all(set(d.stats["chain_counts"]) == {"s,t"} for d in done)   # the drafter drafted all along
    assert any("on s was rebuilt" in r.getMessage() for r in caplog.records)
    assert no_states(pool.values())


class Flaky:
    """Two replicas of the target and one of the drafter. The first target replica to verify goes silent at
    its third verify for `silent_s` (its calls and probes fail as a worker that is gone would), holding its
    states, and then answers again; the other target replica dies at its third verify, for good."""

    def __init__(self, silent_s: float):
        self.pool = {"s": [engine("s")], "t": [engine("t"), engine("t")]}
        self.silent_s = silent_s
        self.first: int | None = None
        self.silent_until = 0.0
        self.dead: set[int] = set()
        self.verifies = [0, 0]
        self.lock = threading.Lock()
        for i, e in enumerate(self.pool["t"]):
            self._wrap(i, e)

    def _gone(self, i: int) -> bool:
        return i in self.dead or (i == self.first and time.monotonic() < self.silent_until)

    def _wrap(self, i: int, e) -> None:
        for method in ("prefill", "draft", "verify", "release"):
            real = getattr(e, method)

            def call(*args, _real=real, _method=method, **kwargs):
                with self.lock:
                    if self._gone(i):
                        raise ConnectionError(f"replica t{i} does not answer")
                    if _method == "verify":
                        self.verifies[i] += 1
                        self.first = i if self.first is None else self.first
                        if self.verifies[i] == 3:
                            if i == self.first:
                                self.silent_until = time.monotonic() + self.silent_s
                            else:
                                self.dead.add(i)
                            raise ConnectionError(f"replica t{i} does not answer")
                return _real(*args, **kwargs)

            setattr(e, method, call)

        def probe():
            if self._gone(i):
                raise ConnectionError(f"replica t{i} does not answer")

        e.probe = probe


def test_a_replica_that_went_silent_and_came_back_takes_the_batch_again_without_a_clash(reference) -> None:
    """The batch leaves the silent replica (which keeps its state), moves to the other, which dies; it waits
    for the first to answer again and moves back. Its state there is new (no clash with the one left behind),
    the old one is released once the replica answers, and every request finishes exactly."""
    fleet = Flaky(silent_s=1.5)
    with running(ReplicaSet.fixed(fleet.pool), target_wait_s=60, probe_s=0.2) as batcher:
        handles = [batcher.submit(r) for r in requests()]
        batcher.start()
        done = [outcome(h) for h in handles]
        exact(done, reference)
        assert fleet.dead and fleet.first is not None and fleet.verifies[fleet.first] > 3   # it took the batch back
        # a replica that died holds nothing; the one that came back gets the old state's release sent again
        [dead] = fleet.dead
        live = [*fleet.pool["s"], fleet.pool["t"][1 - dead]]
        deadline = time.monotonic() + 30
        while not no_states(live) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert no_states(live)


def test_rows_wait_for_a_target_that_answers_again_and_fail_unavailable_past_the_wait(pool, reference) -> None:
    """With no replica of the target answering, the rows leave every worker and wait; the target answers
    again within the router's wait, they join again from their tokens and finish exactly. Past the wait
    they fail UNAVAILABLE, and say why."""
    target = pool["t"]
    real_verify, silent = target.verify, {"until": 0.0, "calls": 0}

    def verify(*args, **kwargs):
        silent["calls"] += 1
        if silent["calls"] == 3:
            silent["until"] = time.monotonic() + 1.0
        if time.monotonic() < silent["until"]:
            raise ConnectionError("the target's worker is restarting")
        return real_verify(*args, **kwargs)

    def probe():
        if time.monotonic() < silent["until"]:
            raise ConnectionError("the target's worker is restarting")

    target.verify, target.probe = verify, probe
    exact(run(pool, requests(), target_wait_s=60), reference)
    assert no_states(pool.values())

    def gone(*args, **kwargs):
        raise ConnectionError("the target's worker is gone")

    target.verify = target.probe = gone
    with running(pool, target_wait_s=0.5) as batcher:
        handles = [batcher.submit(r) for r in requests()]
        batcher.start()
        done = [outcome(h) for h in handles]
    for d in done:
        assert isinstance(d, Failed) and isinstance(d.error, ModelUnavailable), d
        assert "no replica of the target t has answered" in str(d.error) and "gone" in str(d.error)
    assert no_states(pool.values())


def test_orphaned_states_are_released_once_their_worker_answers_and_given_up_after_a_while() -> None:
    from specrouter.router.orphans import Orphans

    now = [0.0]
    answers = {"w": False}
    released: list[str] = []

    class Worker:
        name = "w"
        remote = False

        def release(self, state_id, row_ids=None):
            if not answers["w"]:
                raise ConnectionError("no answer")
            released.append(state_id)

    orphans = Orphans(retry_s=1.0, give_up_s=10.0, clock=lambda: now[0])
    orphans.release(Worker(), "a")
    assert len(orphans) == 1 and not released
    orphans.retry()                      # not due yet
    now[0], answers["w"] = 1.0, True
    orphans.retry()
    assert released == ["a"] and len(orphans) == 0
    answers["w"] = False
    orphans.release(Worker(), "b")
    now[0] = 12.0
    orphans.retry()                      # past give_up_s: the worker's TTL has it
    assert len(orphans) == 0 and released == ["a"]
