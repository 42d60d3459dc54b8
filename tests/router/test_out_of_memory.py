"""A worker that runs out of memory makes the batch smaller, not its requests fail: fewer rows, then a shorter
window, then a shorter chain, the rows prefilled again from their tokens, and every output as without the
fault. A request that cannot fit even alone at a window of 1 on the target ends RESOURCE_EXHAUSTED.

The faults are raised by the engines (torch's OutOfMemoryError), in process and behind real worker servers,
which answer RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import grpc
import pytest
import torch

from specrouter.router.batcher import Batcher
from specrouter.router.handles import Failed, Finished
from specrouter.router.failures import OutOfMemory, out_of_memory
from specrouter.router.requests import GenerationRequest
from specrouter.router.server import status_for
from specrouter.contract.calls import SamplingParams
from specrouter.contract.errors import status_for as worker_status_for
from tests.router.cycles import RecordedCycles
from tests.router.test_row_isolation import CONTEXT, PROMPTS, engine, outcome, served

NEW = 16
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=77)


@pytest.fixture()
def pool():
    return {name: engine(name) for name in ("s", "m", "t")}


def requests(chain, window, params=None) -> list[GenerationRequest]:
    params = params or [SamplingParams()] * len(PROMPTS)
    return [GenerationRequest(p, s, NEW, chain=chain, window=window) for p, s in zip(PROMPTS, params)]


def run(workers, reqs, chooser=None) -> tuple[list, list[tuple[tuple[str, ...], int, int]]]:
    """The requests as one batch; their outcomes and each cycle's (chain, window, rows)."""
    recorded = RecordedCycles()
    batcher = Batcher(workers, "t", CONTEXT, None, chooser=chooser, observers=[recorded])
    try:
        handles = [batcher.submit(r) for r in reqs]
        batcher.start()
        done = [outcome(h) for h in handles]
    finally:
        batcher.stop()
    return done, [(report.chain, report.window, len(rows)) for report, rows in recorded.cycles]


def exhaust(engine, method: str, when) -> list[int]:
    """A fault: `engine.method` raises torch's OutOfMemoryError when `when(args)` holds; how many it raised."""
    real, raised = getattr(engine, method), [0]

    def call(state_id, *args, **kwargs):
        if when(*args):
            raised[0] += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(state_id, *args, **kwargs)

    setattr(engine, method, call)
    return raised


def tokens(done) -> list[list[int]]:
    assert all(isinstance(d, Finished) for d in done), done
    return [d.token_ids for d in done]


def no_states(pool) -> bool:
    return all(not e.state_ids() for e in pool.values())


def test_the_batch_is_halved_and_every_output_stays(pool) -> None:
    params = [SamplingParams(), SAMPLED, SamplingParams(), SamplingParams()]
    reference = tokens(run(pool, requests(("s", "m", "t"), 3, params))[0])
    raised = exhaust(pool["t"], "verify", lambda level, rows, hand_up: len(rows) > 2)
    done, cycles = run(pool, requests(("s", "m", "t"), 3, params))
    assert tokens(done) == reference   # greedy and sampled alike: the rows go on where they stopped
    # the cycle that failed is not among the cycles done: every one ran two rows at most
    assert raised[0] == 1 and max(rows for _, _, rows in cycles) == 2
    assert no_states(pool)


def test_one_row_gets_a_shorter_window(pool) -> None:
    reference = tokens(run(pool, requests(("s", "m", "t"), 4)[:1])[0])
    raised = exhaust(pool["m"], "verify", lambda level, rows, hand_up: max(len(r.proposal) for r in rows) > 2)
    done, cycles = run(pool, requests(("s", "m", "t"), 4)[:1])
    assert tokens(done) == reference
    assert raised[0] == 1 and {w for _, w, _ in cycles} == {2}   # 4, then 2 from then on
    assert no_states(pool)


class EveryModelLeft:
    """A chooser that runs every model the batch still has, at a window of 2."""

    def choose(self, batch, chain, window):
        return tuple(m for m in ("s", "m", "t") if m in batch.workers), 2


def test_a_drafter_that_cannot_draft_one_token_leaves_the_chain_of_auto(pool) -> None:
    reference = tokens(run(pool, requests(("t",), 0)[:1])[0])
    raised = exhaust(pool["s"], "draft", lambda level, window, rows: True)
    done, cycles = run(pool, requests(None, 0)[:1], EveryModelLeft())
    assert tokens(done) == reference
    assert raised[0] == 2   # at a window of 2, then of 1
    assert {c for c, _, _ in cycles} == {("m", "t")}
    assert no_states(pool)


def test_a_row_that_does_not_fit_alone_ends_resource_exhausted(pool) -> None:
    exhaust(pool["t"], "draft", lambda level, window, rows: True)
    done, _ = run(pool, requests(("t",), 0)[:1])
    assert isinstance(done[0], Failed) and isinstance(done[0].error, OutOfMemory)
    code, message = status_for(done[0].error)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "worker of t" in message and "shorter prompt" in message
    assert no_states(pool)


def test_a_remote_worker_answers_resource_exhausted_and_the_batch_shrinks(pool) -> None:
    assert worker_status_for(torch.OutOfMemoryError("x")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert worker_status_for(MemoryError()) == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(RuntimeError) as refused:   # the CPU allocator, asked for more than the system gives
        torch.empty(2**62, dtype=torch.uint8)
    assert worker_status_for(refused.value) == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert worker_status_for(RuntimeError("shape mismatch")) == grpc.StatusCode.INTERNAL
    reference = tokens(run(pool, requests(("s", "t"), 3))[0])
    raised = exhaust(pool["s"], "draft", lambda level, window, rows: len(rows) > 1)
    with served(pool) as remotes:
        done, cycles = run(remotes, requests(("s", "t"), 3))
    assert tokens(done) == reference
    assert raised[0] == 2 and {rows for _, _, rows in cycles} == {1}   # 4 rows, then 2, then 1
    assert no_states(pool)


def test_out_of_memory_is_told_apart_from_other_failures() -> None:
    assert out_of_memory(torch.OutOfMemoryError("x")) and out_of_memory(MemoryError())
    assert not out_of_memory(ValueError("x")) and not out_of_memory(RuntimeError("CUDA error"))


@pytest.mark.parametrize("model", ["s", "t"])
def test_a_new_group_whose_prefill_runs_out_of_memory_is_halved_not_failed(pool, model) -> None:
    """Requests that arrive together are prefilled as one group; a worker that cannot prefill more than one
    row at a time makes the group join a row at a time, and every request finishes as without the fault."""
    reference = tokens(run(pool, requests(("s", "t"), 3))[0])
    raised = exhaust(pool[model], "prefill", lambda rows, *args: len(rows) > 1)
    done, cycles = run(pool, requests(("s", "t"), 3))
    assert tokens(done) == reference
    assert raised[0] >= 2                        # 4 rows, then 2, then 1 at a time
    assert max(rows for _, _, rows in cycles) == 1
    assert no_states(pool)
