"""Worker operations: timings, TTL reclaim, refusals, and reduced precision."""

from __future__ import annotations

import pytest
import torch

from specrouter.router.chain import ChainBatch, Row, run_to_completion
from specrouter.worker.calls import RowStep, SamplingParams
from specrouter.worker.engine import EngineSettings, UnknownStateError, WorkerEngine
from specrouter.worker.forward import ModelForward
from specrouter.worker.state import StateError
from tests.conftest import tiny_llama


def engine(dtype=torch.float32, ttl=600.0) -> WorkerEngine:
    return WorkerEngine("t", ModelForward(tiny_llama(3, 64, 2).to(dtype)), EngineSettings(state_ttl_s=ttl))


def step(row_id: str, pending: list[int], rollback: int = 0) -> RowStep:
    return RowStep(row_id=row_id, pending=pending, sampling=SamplingParams(), cycle=0, rollback=rollback)


def test_operations_report_their_forward_timings() -> None:
    e = engine()
    pre = e.prefill("s", [("a", [1, 2, 3]), ("b", [4])])
    assert pre.timings[0].batch_size == 2 and pre.timings[0].tokens_valid == 4 and pre.forward_ns > 0
    out = e.draft("s", 0, 3, [step("a", [4]), step("b", [5, 6])])
    assert [t.tokens_per_row for t in out.timings] == [2, 1, 1]
    assert [len(t) for t in out.tokens] == [3, 3]


def test_states_idle_past_their_ttl_are_reclaimed() -> None:
    e = engine(ttl=30.0)
    e.prefill("old", [("a", [1, 2])])
    e.prefill("new", [("b", [1, 2])])
    e.state("old").last_used -= 60
    assert e.reclaim_expired() == ["old"]
    with pytest.raises(UnknownStateError):
        e.draft("old", 0, 1, [step("a", [3])])
    assert e.state_ids() == ["new"]


def test_calls_must_name_exactly_the_states_rows() -> None:
    e = engine()
    e.prefill("s", [("a", [1]), ("b", [2])])
    with pytest.raises(StateError, match="holds"):
        e.draft("s", 0, 1, [step("a", [3])])
    with pytest.raises(StateError, match="pending"):
        e.draft("s", 0, 1, [step("a", []), step("b", [3])])
    with pytest.raises(StateError, match="rollback"):
        e.draft("s", 0, 1, [step("a", [3], rollback=5), step("b", [3])])


def test_context_length_is_enforced() -> None:
    e = engine()
    with pytest.raises(StateError, match="context"):
        e.prefill("s", [("a", list(range(1, 60)) * 5)])


def test_release_of_some_rows_keeps_the_others() -> None:
    e = engine()
    e.prefill("s", [("a", [1, 2]), ("b", [3])])
    e.release("s", ["a"])
    assert e.state("s").row_ids == ["b"]
    e.release("s")
    assert e.state_ids() == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision_chains_run_and_agree_with_target_only(dtype) -> None:
    engines = {n: WorkerEngine(n, ModelForward(tiny_llama(seed, h, l, sharpness=4.0).to(dtype)))
               for n, (seed, h, l) in {"s": (1, 16, 1), "m": (2, 32, 2), "t": (3, 64, 2)}.items()}

    def run(chain, window):
        batch = ChainBatch(engines, "t", 256)
        batch.add([Row(f"r{i}", p, len(p), SamplingParams(), 16) for i, p in enumerate([[1, 2, 3], [4, 5, 6, 7, 8]])])
        return {k: r.generated for k, r in run_to_completion(batch, lambda _: (chain, window)).items()}

    reference = run(("t",), 1)
    assert all(len(v) == 16 for v in reference.values())
    assert run(("s", "m", "t"), 3) == reference


def test_prefill_returns_the_models_guesses_on_the_prompt() -> None:
    """With `predictions`, each row gets the argmax next token after each of its last tokens, exactly as
    the model computes them alone (a shorter row's padding changes nothing)."""
    model = tiny_llama(3, 64, 2)
    e = WorkerEngine("t", ModelForward(model))
    long, short = [5, 9, 2, 33, 7, 1, 12], [8, 3]
    out = e.prefill("s", [("a", long), ("b", short)], predictions=4)
    with torch.no_grad():
        want = [model(torch.tensor([p])).logits[0].argmax(-1).tolist() for p in (long, short)]
    assert out.tokens == [want[0][-4:], want[1]]       # the short row has only 2 positions
    assert e.prefill("u", [("a", long)]).tokens == [[]]  # none asked for, none computed
    with pytest.raises(StateError):
        e.prefill("v", [("a", long)], predictions=-1)
