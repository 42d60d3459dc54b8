"""Placement over replicas: a batch starts on the least loaded replica of each model and stays there; a drafter's
replica lost costs speed; a target replica lost moves its rows to another replica, prefilled again from their
tokens, with the output unchanged; with no replica of the target left the requests fail UNAVAILABLE.

Replicas are tiny engines in this process with the same weights (tests/conftest.py's seeds); a replica that
is lost raises ConnectionError, as a worker that is gone answers UNAVAILABLE over the wire."""

from __future__ import annotations

import contextlib
import random
from collections import defaultdict
from types import SimpleNamespace

import grpc
import pytest

from specrouter.router.batcher import Batcher
from specrouter.router.failures import WorkerCallFailed, worker_gone
from specrouter.router.handles import Failed, Finished
from specrouter.router.health import ModelUnavailable, WorkerHealth
from specrouter.router.placement import Placement, least_loaded
from specrouter.router.replicas import ReplicaSet
from specrouter.router.requests import GenerationRequest
from specrouter.router.server import status_for
from specrouter.contract.calls import SamplingParams
from tests.router.test_replicas import Fleet
from tests.router.test_row_isolation import CONTEXT, engine, outcome
from tests.router.test_worker_failover import Prefer

PROMPTS = [[5, 9, 3, 17, 2], [7, 1, 40, 22], [11, 12, 13]]
PARAMS = [SamplingParams(), SamplingParams(temperature=0.9, top_k=20, seed=1234), SamplingParams()]
NEW = 16
METHODS = ("prefill", "draft", "verify", "release")


def fakes(**counts: int) -> ReplicaSet:
    return ReplicaSet.fixed({m: [SimpleNamespace(name=m, address=f"{m}:{i}", remote=False, probe=lambda timeout_s=2.0: None)
                                   for i in range(n)] for m, n in counts.items()})


def test_the_least_loaded_replica_of_each_model_is_chosen() -> None:
    replicas = fakes(d=2, t=3)
    (d0, d1), (t0, t1, t2) = replicas.of("d"), replicas.of("t")
    placement = Placement(replicas, WorkerHealth(replicas, "t"), "t", random.Random(0))
    loads = {id(d0): 4, id(d1): 3, id(t0): 2, id(t1): 0, id(t2): 5}
    assert placement.place(loads) == {"d": d1, "t": t1}
    assert placement.spare("t", loads, besides=t1) is t0
    assert least_loaded([t2], loads, random.Random(0)) is t2


def test_ties_are_broken_at_random_so_that_routers_spread() -> None:
    """Routers do not see each other's load: with none anywhere, each picks at random. The chance that 64
    fair picks all land on one of two replicas is 2 * 2**-64."""
    replicas = fakes(t=2)
    placement = Placement(replicas, WorkerHealth(replicas, "t"), "t", random.Random(3))
    picked = {id(placement.place({})["t"]) for _ in range(64)}
    assert picked == {id(w) for w in replicas.of("t")}


def test_replicas_that_are_down_are_passed_over_and_the_target_is_placed_all_the_same() -> None:
    replicas = fakes(d=2, t=2)
    (d0, d1), (t0, t1) = replicas.of("d"), replicas.of("t")
    health = WorkerHealth(replicas, "t")
    placement = Placement(replicas, health, "t", random.Random(0))
    health.mark_down(d0, "d", "gone")
    health.mark_down(t1, "t", "gone")
    assert placement.place({id(d1): 9, id(t0): 9}) == {"d": d1, "t": t0}
    assert health.down() == {}   # each model has a replica up
    health.mark_down(d1, "d", ConnectionError("refused"))
    health.mark_down(t0, "t", "gone")
    assert health.down() == {"d": "refused"}   # the target never sits out
    placed = placement.place({})
    assert set(placed) == {"t"} and placed["t"] in (t0, t1)   # tried: its failure reaches the requests
    assert placement.spare("t", {}, besides=t0) is None
    health.probe_once()   # fakes that answer their probe are back at the first round
    assert health.down() == {} and placement.place({id(d0): 1, id(t0): 1}) == {"d": d1, "t": t1}


def test_with_no_replica_of_the_target_left_a_batch_cannot_start() -> None:
    replicas = fakes(d=1)
    with pytest.raises(ModelUnavailable, match="no replica of the target t is left"):
        Placement(replicas, WorkerHealth(replicas, "t"), "t").place({})


def test_a_replica_that_joins_takes_new_batches_and_one_that_leaves_takes_none() -> None:
    fleet = Fleet({"worker-t": ["10.0.0.1"]}, {f"10.0.0.{i}:50052": {"model": "t"} for i in (1, 2)})
    replicas = fleet.open(["dns:///worker-t:50052"])
    placement = Placement(replicas, WorkerHealth(replicas, "t"), "t", random.Random(0))
    [first] = replicas.of("t")
    assert placement.place({id(first): 7}) == {"t": first}
    fleet.names["worker-t"] = ["10.0.0.1", "10.0.0.2"]   # a pod joins
    replicas.refresh()
    second = fleet.connected["10.0.0.2:50052"]
    assert placement.place({id(first): 2}) == {"t": second}
    fleet.names["worker-t"] = ["10.0.0.2"]   # the first pod leaves
    replicas.refresh()
    assert placement.place({id(second): 5}) == {"t": second}


def test_only_an_unreachable_worker_counts_as_lost() -> None:
    class Call(grpc.RpcError, grpc.Call):
        """A remote worker's error as a stub raises it."""

        def __init__(self, code):
            self._code = code

        def code(self):
            return self._code

        def details(self):
            return ""

        initial_metadata = trailing_metadata = is_active = time_remaining = cancel = add_callback = details

    assert worker_gone(Call(grpc.StatusCode.UNAVAILABLE)) and worker_gone(Call(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert worker_gone(ConnectionError("refused"))
    assert not worker_gone(Call(grpc.StatusCode.INTERNAL)) and not worker_gone(RuntimeError("a bug"))


# -- batches over replicas in this process ----------------------------------------------------------------

class Replicas:
    """Two replicas of `s` and of `t`; every call recorded as (replica, method, state id). `kill(after=N)`: a
    replica whose `verify` is called more than N times is lost from then on (the first `victims` of them)."""

    def __init__(self) -> None:
        self.pool = {m: [engine(m), engine(m)] for m in ("s", "t")}
        self.calls: list[tuple[str, str, str]] = []
        self.dead: list[str] = []
        self._after, self._victims, self._method = None, 0, "verify"
        self._verifies: dict[str, int] = defaultdict(int)
        for model, engines in self.pool.items():
            for i, e in enumerate(engines):
                self._wrap(e, f"{model}{i}")

    def kill(self, after: int, victims: int = 1, method: str = "verify") -> None:
        self._after, self._victims, self._method = after, victims, method

    def _wrap(self, e, label: str) -> None:
        for method in METHODS:
            real = getattr(e, method)

            def call(state_id, *args, _real=real, _method=method, **kwargs):
                if label in self.dead:
                    raise ConnectionError(f"replica {label} is gone")
                if self._after is not None and _method == self._method:
                    self._verifies[label] += 1
                    if self._verifies[label] > self._after and len(self.dead) < self._victims:
                        self.dead.append(label)
                        raise ConnectionError(f"replica {label} is gone")
                self.calls.append((label, _method, state_id))
                return _real(state_id, *args, **kwargs)

            setattr(e, method, call)

        def probe():
            if label in self.dead:
                raise ConnectionError(f"replica {label} is gone")

        e.probe = probe

    def states_on(self, label: str) -> set[str]:
        return {s for lb, _, s in self.calls if lb == label}


@contextlib.contextmanager
def batcher_over(workers, *chains):
    batcher = Batcher(workers, "t", CONTEXT, None, chooser=Prefer(*chains))
    try:
        yield batcher
    finally:
        batcher.stop()


def run(batcher: Batcher, requests: list[GenerationRequest], start: bool = True) -> list[Finished | Failed]:
    """The requests' outcomes; with `start`, they are submitted before the loop starts, so they are admitted
    together."""
    handles = [batcher.submit(r) for r in requests]
    if start:
        batcher.start()
    return [outcome(h) for h in handles]


def greedy(prompts, chain=None, window=0, params=PARAMS) -> list[GenerationRequest]:
    return [GenerationRequest(p, s, NEW, chain=chain, window=window) for p, s in zip(prompts, params)]


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """The outputs on one worker per model, with no fault, on the chain s,t at a window of 3 (a sampled row's
    tokens are reproducible for a given chain and window); the greedy ones are the target's own."""
    with batcher_over({"s": engine("s"), "t": engine("t")}, ("s", "t")) as batcher:
        done = run(batcher, greedy(PROMPTS, chain=("s", "t"), window=3))
        alone = run(batcher, greedy(PROMPTS, chain=("t",), params=[SamplingParams()] * len(PROMPTS)), start=False)
    assert all(isinstance(d, Finished) for d in done + alone), done + alone
    assert [done[i].token_ids for i in (0, 2)] == [alone[i].token_ids for i in (0, 2)]
    assert done[1].token_ids != alone[1].token_ids   # the sampled row
    return [d.token_ids for d in done]


def test_each_batch_stays_on_the_replicas_it_started_on_and_a_second_batch_goes_to_the_others(reference) -> None:
    fleet = Replicas()
    with batcher_over(ReplicaSet.fixed(fleet.pool), ("s", "t")) as batcher:
        done = run(batcher, greedy(PROMPTS[:2], chain=("s", "t"), window=3, params=PARAMS[:2])
                   + greedy(PROMPTS[2:], chain=("t",), params=PARAMS[2:]))
    assert [d.token_ids for d in done] == reference
    # two batches, one on each replica of the target, for their whole life
    first, second = fleet.states_on("t0"), fleet.states_on("t1")
    assert len(first) == len(second) == 1 and first != second, (first, second)
    # the drafter held the named chain's batch alone: the target-only batch never calls it
    drafted = fleet.states_on("s0") | fleet.states_on("s1")
    assert len(drafted) == 1 and drafted < first | second, drafted


def test_a_lost_target_replica_moves_its_rows_to_another_with_the_same_output(reference, caplog) -> None:
    fleet = Replicas()
    fleet.kill(after=3)   # at its fourth verify: each row has at most 12 of its 16 tokens
    with batcher_over(ReplicaSet.fixed(fleet.pool), ("s", "t")) as batcher:
        done = run(batcher, greedy(PROMPTS))
        assert all(isinstance(d, Finished) for d in done), done
        assert [d.token_ids for d in done] == reference   # greedy rows and the sampled one alike
        [dead] = fleet.dead
        spare = "t1" if dead == "t0" else "t0"
        lost = fleet.pool["t"][int(dead[1])]
        assert not batcher.health.is_up(lost) and batcher.health.down() == {}
    # after the loss the batch's state went on on the other replica, prefilled again there under a new state
    # id (the lost replica, should it come back, holds the old one)
    index = fleet.calls.index(next(c for c in fleet.calls if c[0] == spare))
    assert fleet.calls[index][1] == "prefill" and len(fleet.states_on(spare)) == 1
    assert fleet.states_on(spare).isdisjoint(fleet.states_on(dead))
    assert all(d.stats["chain_counts"] == {"s,t": d.stats["cycles"]} for d in done)
    moved = [r.getMessage() for r in caplog.records if "move to" in r.getMessage()]
    assert moved == [f"the replica of t at in-process:t#{dead[1]} failed (replica {dead} is gone); 3 row(s) move to "
                     f"in-process:t#{spare[1]} and join again from their tokens"]


def test_a_lost_drafter_replica_costs_speed_and_new_batches_start_on_the_other(reference) -> None:
    fleet = Replicas()
    fleet.kill(after=2, method="draft")
    with batcher_over(ReplicaSet.fixed(fleet.pool), ("s", "t"), ("t",)) as batcher:
        first = run(batcher, greedy(PROMPTS[:1], params=PARAMS[:1]))[0]
        assert isinstance(first, Finished) and first.token_ids == reference[0]
        assert first.stats["chain_counts"]["s,t"] == 2 and first.stats["chain_counts"]["t"] > 0
        [dead] = fleet.dead
        second = run(batcher, greedy(PROMPTS[1:2], params=PARAMS[1:2]), start=False)[0]
        assert isinstance(second, Finished) and second.token_ids == reference[1]
        assert set(second.stats["chain_counts"]) == {"s,t"}   # the other replica of s drafts for it
        assert batcher.health.down() == {}


def test_a_named_chain_moves_to_another_replica_of_its_drafter(reference) -> None:
    fleet = Replicas()
    fleet.kill(after=2, method="draft")
    with batcher_over(ReplicaSet.fixed(fleet.pool), ("t",)) as batcher:
        [done] = run(batcher, greedy(PROMPTS[:1], chain=("s", "t"), window=3, params=PARAMS[:1]))
    assert isinstance(done, Finished) and done.token_ids == reference[0]
    assert set(done.stats["chain_counts"]) == {"s,t"} and fleet.dead


def test_with_every_replica_of_the_target_lost_the_requests_fail_unavailable_naming_it() -> None:
    fleet = Replicas()
    fleet.kill(after=1, victims=2)   # each at its second verify: the rows are far from their end
    with batcher_over(ReplicaSet.fixed(fleet.pool), ("s", "t")) as batcher:
        done = run(batcher, greedy(PROMPTS))
        assert sorted(fleet.dead) == ["t0", "t1"]
        assert batcher.running() == 0
    for d in done:
        assert isinstance(d, Failed) and isinstance(d.error, WorkerCallFailed) and d.error.model == "t"
        assert status_for(d.error) == (grpc.StatusCode.UNAVAILABLE,
                                       f"the worker of t is unavailable: replica {fleet.dead[1]} is gone")
