"""Rows that run into the end of the context: every level's proposal fits, and the output is the target's.

An intermediate level hands the next one token more than it was given (its bonus or recovered token), so
near the end of the context the target may be asked to verify more than the row has room for. Here the
intermediates share the drafter's weights: they accept every draft and always hand up that token more.
"""

from __future__ import annotations

import pytest

from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.row import FINISH_LENGTH, Row
from specrouter.contract.calls import SamplingParams
from specrouter.worker.engine import WorkerEngine
from specrouter.worker.forward import ModelForward
from tests.conftest import tiny_llama

CONTEXT = 64
DRAFTER = (1, 16, 1)   # seed, hidden size, layers (tests/conftest.py's drafter `s`)
TARGET = (3, 64, 2)    # the tiny pool's target `t`
PROMPT_LENGTHS = [62, 61, 59, 55, 48, 5]   # 62 = CONTEXT - 2, the longest prompt a request may have


def engine(name: str, seed: int, hidden: int, layers: int) -> WorkerEngine:
    model = tiny_llama(seed, hidden, layers)
    model.config.max_position_embeddings = CONTEXT   # the worker's context
    return WorkerEngine(name, ModelForward(model))


@pytest.fixture(scope="module")
def engines() -> dict[str, WorkerEngine]:
    """`s` drafts; `m1` and `m2` are copies of it; `t` is the target."""
    return {"s": engine("s", *DRAFTER), "m1": engine("m1", *DRAFTER), "m2": engine("m2", *DRAFTER),
            "t": engine("t", *TARGET)}


@pytest.fixture()
def pool(engines):
    yield engines
    for e in engines.values():   # what a failed test left behind
        for state in e.state_ids():
            e.release(state)


def rows() -> list[Row]:
    """Rows that may generate up to the end of the context (the most a request may ask for)."""
    out = []
    for i, n in enumerate(PROMPT_LENGTHS):
        prompt = [(7 * i + 3 * j) % 63 + 1 for j in range(n)]
        out.append(Row(f"r{i}", prompt, n, SamplingParams(), CONTEXT - 1 - n))
    return out


def generate(pool, chain, window, batch_rows: list[Row]) -> dict[str, Row]:
    batch = ChainBatch(pool, "t", CONTEXT)
    batch.add(batch_rows)
    done = run_to_completion(batch, lambda _: (chain, window))
    assert all(not e.state_ids() for e in pool.values()), "a finished batch left worker state behind"
    return done


@pytest.fixture(scope="module")
def reference(engines) -> dict[str, list[int]]:
    return {r: row.generated for r, row in generate(engines, ("t",), 0, rows()).items()}


@pytest.mark.parametrize("chain", [("s", "m1", "t"), ("s", "m1", "m2", "t"), ("m1", "m2", "t"), ("s", "t")])
@pytest.mark.parametrize("window", [8, 3])
def test_rows_at_the_context_end_finish_as_target_only_decoding(pool, reference, chain, window) -> None:
    done = generate(pool, chain, window, rows())
    assert {r: row.generated for r, row in done.items()} == reference
    for row in done.values():
        assert row.finish_reason == FINISH_LENGTH and len(row.tokens) == CONTEXT - 1


@pytest.mark.parametrize("length", [62, 61, 60, 57])
def test_a_row_alone_at_the_context_end(pool, length) -> None:
    """One row, no other to lower the batch's window: the window it asks for is all the room it has."""
    prompt = [(5 * j) % 63 + 1 for j in range(length)]
    row = lambda: Row("alone", prompt, length, SamplingParams(), CONTEXT - 1 - length)  # noqa: E731
    expected = generate(pool, ("t",), 0, [row()])["alone"].generated
    for chain in [("s", "m1", "t"), ("s", "m1", "m2", "t")]:
        assert generate(pool, chain, CONTEXT - 1 - length, [row()])["alone"].generated == expected


def test_sampled_rows_at_the_context_end_finish_and_repeat_with_their_seeds(pool) -> None:
    """Proposals cut to the room keep their rows: sampled rows run to the end of the context, and a seed
    gives the same tokens again."""
    params = [SamplingParams(temperature=0.8, seed=3), SamplingParams(temperature=1.2, top_k=10, seed=4),
              SamplingParams(temperature=1.0, top_p=0.9, repetition_penalty=1.2, seed=5)]

    def sampled() -> list[Row]:
        return [Row(r.row_id, r.tokens, r.prompt_len, p, r.max_new_tokens) for r, p in zip(rows(), params)]

    first = generate(pool, ("s", "m1", "m2", "t"), 8, sampled())
    assert all(row.finish_reason == FINISH_LENGTH and len(row.tokens) == CONTEXT - 1 for row in first.values())
    again = generate(pool, ("s", "m1", "m2", "t"), 8, sampled())
    assert {r: row.generated for r, row in again.items()} == {r: row.generated for r, row in first.items()}
