"""An error that belongs to one row ends that row alone; the rest of its batch goes on, token for token.

Whole-call failures (a worker that does not answer) keep their own handling: tests/router/test_worker_failover.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import grpc
import pytest

from specrouter.router.batcher import Batcher
from specrouter.router.handles import Failed, Finished
from specrouter.router.remote import RemoteWorker
from specrouter.router.requests import GenerationRequest
from specrouter.router.server import status_for
from specrouter.v1 import worker_pb2 as pb
from specrouter.contract.calls import RowStep, SamplingParams
from specrouter.worker.compute import ComputeLoop
from specrouter.worker.engine import ContextLengthError, WorkerEngine
from specrouter.worker.forward import ModelForward
from specrouter.worker.server import create_server
from specrouter.worker.settings import WorkerSettings
from tests.conftest import TINY_VOCAB, tiny_llama

CONTEXT = 256
SHAPES = {"s": (1, 16, 1), "m": (2, 32, 2), "t": (3, 64, 2)}   # tests/conftest.py's tiny pool
PROMPTS = [[5, 9, 3, 17, 2], [7, 1, 40, 22], [11, 12, 13], [30, 2, 8, 8, 19, 4]]
NEW = 20
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=1234)
LOST = 1      # the request whose row a worker loses
LOST_AT = 3   # ... on this call of the operation


def engine(name: str, context: int | None = None) -> WorkerEngine:
    model = tiny_llama(*SHAPES[name])
    if context is not None:
        model.config.max_position_embeddings = context
    return WorkerEngine(name, ModelForward(model))


@pytest.fixture(scope="module")
def engines() -> dict[str, WorkerEngine]:
    return {name: engine(name) for name in SHAPES}


@pytest.fixture()
def pool(engines):
    yield engines
    for e in engines.values():   # undo the faults a test put in, drop what a failed test left
        for attr in ("draft", "verify", "prefill"):
            vars(e).pop(attr, None)
        for state in e.state_ids():
            e.release(state)


def requests(chain, window) -> list[GenerationRequest]:
    params = [SamplingParams(), SamplingParams(), SAMPLED, SamplingParams()]
    return [GenerationRequest(p, s, NEW, chain=chain, window=window) for p, s in zip(PROMPTS, params)]


def outcome(handle, timeout: float = 120.0) -> Finished | Failed:
    while True:
        event = handle.events.get(timeout=timeout)
        if isinstance(event, (Failed, Finished)):
            return event


def run_together(workers, reqs: list[GenerationRequest], fault=None) -> list:
    """The requests, submitted before the loop starts so that they form one batch; their outcomes, once the
    batch is done. `fault(handles)` is called before the loop starts."""
    batcher = Batcher(workers, "t", CONTEXT, None)
    try:
        handles = [batcher.submit(r) for r in reqs]
        if fault is not None:
            fault(handles)
        batcher.start()
        done = [outcome(h) for h in handles]
        assert batcher.health.down() == {}, "a row's fault took its model out of the pool"
    finally:
        batcher.stop()
    engines = [w for w in workers.values() if isinstance(w, WorkerEngine)]
    assert all(not e.state_ids() for e in engines), "a row was not released everywhere"
    return done


@pytest.fixture(scope="module")
def reference(engines) -> list[list[int]]:
    """Target-only greedy decoding for the greedy requests; the sampled one as it runs with no fault."""
    done = run_together(engines, requests(("t",), 0))
    sampled = run_together(engines, requests(("s", "m", "t"), 3))
    assert all(isinstance(d, Finished) for d in done + sampled)
    return [d.token_ids for d in done[:2]] + [sampled[2].token_ids] + [done[3].token_ids]


def lose_row(engine: WorkerEngine, method: str, at: int = LOST_AT):
    """A fault: on its `at`-th call of `method`, `engine` loses the row of request LOST from the state (as
    if released by mistake)."""
    def fault_in(handles) -> None:
        real, count = getattr(engine, method), [0]

        def losing(state_id, *args, **kwargs):
            count[0] += 1
            if count[0] == at:
                engine.release(state_id, [handles[LOST].row_id])
            return real(state_id, *args, **kwargs)

        setattr(engine, method, losing)
    return fault_in


def assert_alone(done, reference, code: grpc.StatusCode, *words: str) -> None:
    """Request LOST failed with `code` and a message holding `words`; every other one finished exactly."""
    for i, d in enumerate(done):
        if i != LOST:
            assert isinstance(d, Finished), f"request {i} failed with the row that broke: {d}"
            assert d.token_ids == reference[i], f"request {i}"
    assert isinstance(done[LOST], Failed), done[LOST]
    error = done[LOST].error
    assert error.code == code, error
    assert status_for(error) == (code, str(error)), "the router's client gets another status"
    assert all(w in str(error) for w in words), error


def assert_exact(done, reference) -> None:
    for i, d in enumerate(done):
        assert isinstance(d, Finished), f"request {i} failed: {d}"
        assert d.token_ids == reference[i], f"request {i}"


@pytest.mark.parametrize("model,method", [("s", "draft"), ("m", "verify"), ("t", "verify")])
def test_a_row_lost_by_one_worker_is_rebuilt_and_every_request_finishes(pool, reference, model, method,
                                                                        caplog) -> None:
    """A worker whose state lost a row (no fault of the row) has its state rebuilt from the rows' tokens:
    every request finishes with the tokens it would have had, and no model leaves the pool."""
    done = run_together(pool, requests(("s", "m", "t"), 3), lose_row(pool[model], method))
    assert_exact(done, reference)
    assert any(f"on {model} was rebuilt" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("short", ["s", "t"])
def test_a_row_past_a_workers_context_fails_alone_out_of_range(pool, reference, short) -> None:
    """The router's context is larger than one worker's: the row that reaches that worker's context fails
    OUT_OF_RANGE, the others finish, and the model stays in the pool."""
    workers = {**pool, short: engine(short, context=32)}
    reqs = requests(("s", "m", "t"), 3)
    reqs[LOST] = GenerationRequest(list(range(1, 27)), SamplingParams(), NEW, chain=("s", "m", "t"), window=3)
    done = run_together(workers, reqs)
    assert_alone(done, reference, grpc.StatusCode.OUT_OF_RANGE, f"worker of {short}", "context of 32")


def test_a_prompt_the_workers_refuse_fails_alone_at_the_prefill(pool, reference) -> None:
    reqs = requests(("s", "m", "t"), 3)
    reqs[LOST] = GenerationRequest([4, TINY_VOCAB + 5, 6], SamplingParams(), NEW, chain=("s", "m", "t"), window=3)
    done = run_together(pool, reqs)
    assert_alone(done, reference, grpc.StatusCode.INVALID_ARGUMENT, f"{TINY_VOCAB + 5}", "vocabulary")


def test_a_worker_refuses_a_call_for_some_rows_before_it_changes_the_state() -> None:
    """The router sends the same rollbacks again to the rows that go on, so the refused call must not
    have applied them."""
    e = engine("t", context=12)
    e.prefill("x", [("a", [1, 2]), ("b", [3, 4, 5, 6, 7, 8, 9, 10])])
    e.draft("x", 0, 2, [RowStep("a", [5], SamplingParams(), 0), RowStep("b", [11], SamplingParams(), 0)])
    state = e.state("x")
    before = (list(state.row_ids), state.tokens.clone(), state.mask.clone())
    with pytest.raises(ContextLengthError) as err:   # b: 10 - 2 + 1 + 4 = 13 tokens
        e.draft("x", 0, 4, [RowStep("b", [12], SamplingParams(), 1, rollback=2),
                            RowStep("a", [6], SamplingParams(), 1, rollback=2)])
    assert err.value.row_ids == ("b",) and "context of 12" in str(err.value)
    assert state.row_ids == before[0] and state.tokens.equal(before[1]) and state.mask.equal(before[2])
    e.release("x")


# -- over the wire: the worker names the rows in its error's trailing metadata ------------------------

@contextlib.contextmanager
def served(engines: dict[str, WorkerEngine]):
    """Each engine behind a real worker server on port 0; the router's remote workers for them."""
    servers, remotes = [], {}
    try:
        for name, e in engines.items():
            info = pb.InfoResponse(model_name=name, vocab_size=e.vocab, context_length=e.forward.context_length)
            server, port, _ = create_server(WorkerSettings(model_dir=Path(name), port=0, threads=4), e, info,
                                            ComputeLoop())
            server.start()
            servers.append(server)
            remotes[name] = RemoteWorker(f"127.0.0.1:{port}", timeout_s=30)
        yield remotes
    finally:
        for r in remotes.values():
            r.close()
        for s in servers:
            s.stop(None)


@pytest.mark.parametrize("model,method", [("s", "draft"), ("t", "verify")])
def test_a_row_lost_by_a_remote_worker_is_rebuilt(pool, reference, model, method) -> None:
    with served(pool) as remotes:
        done = run_together(remotes, requests(("s", "m", "t"), 3), lose_row(pool[model], method))
    assert_exact(done, reference)
    assert all(not e.state_ids() for e in pool.values())
