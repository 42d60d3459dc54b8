"""Worker operations: timings, TTL reclaim, refusals, reduced precision, and rows that come and go."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.row import Row
from specrouter.contract.calls import RowStep, SamplingParams, VerifyRow
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


def test_live_rows_count_rows_not_free_slots() -> None:
    e = engine()
    e.prefill("s", [(r, [1, 2]) for r in "abcde"])
    e.prefill("t", [("f", [3])])
    e.release("s", ["c"])   # one slot of five free: kept in place
    assert e.state("s").batch_size == 5 and e.live_rows() == 5
    e.release("s")
    assert e.live_rows() == 1


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
    # more than a row has positions: each row's every position, not a tensor of that many columns
    assert e.prefill("w", [("a", long), ("b", short)], predictions=2**31).tokens == want
    with pytest.raises(StateError):
        e.prefill("v", [("a", long)], predictions=-1)


@dataclass
class Decoding:
    """A row as a router drives it: what the model has not seen yet, and what to drop first."""
    pending: list[int]
    params: SamplingParams
    rollback: int = 0
    generated: list[int] = None

    def __post_init__(self) -> None:
        self.generated = []


def decode_alone(e: WorkerEngine, prompt: list[int], params: SamplingParams, n: int) -> list[int]:
    """Greedy tokens of `prompt` decoded by itself, one token a call."""
    e.prefill("alone", [("r", prompt[:-1])])
    out = [prompt[-1]]
    for _ in range(n):
        out += e.draft("alone", 0, 1, [RowStep("r", out[-1:], params, 0)]).tokens[0]
    e.release("alone")
    return out[1:]


@pytest.mark.parametrize("seed", range(3))
def test_rows_that_come_and_go_in_any_order_decode_as_alone(seed: int) -> None:
    """Rows join a running state and leave it at random, mid-decode; calls name them in a random order,
    drafts of several tokens and verifies of random proposals leave rollbacks behind. Every row's tokens
    are exactly those it gets decoded alone (free slots and the other rows change nothing)."""
    rng = random.Random(seed)
    e = engine()
    prompts = {f"r{i}": [rng.randrange(1, 64) for _ in range(rng.randrange(2, 40))] for i in range(16)}
    params = {r: SamplingParams(repetition_penalty=rng.choice([1.0, 1.0, 1.5])) for r in prompts}
    wanted = {r: rng.randrange(1, 20) for r in prompts}   # when each row leaves
    alone = {r: decode_alone(e, p, params[r], wanted[r] + 4) for r, p in prompts.items()}
    waiting, live, done = list(prompts), {}, {}
    rng.shuffle(waiting)
    while waiting or live:
        if waiting and (not live or rng.random() < 0.4):
            new = [waiting.pop() for _ in range(min(len(waiting), rng.randrange(1, 6)))]
            e.prefill("s", [(r, prompts[r][:-1]) for r in new])
            live.update({r: Decoding([prompts[r][-1]], params[r]) for r in new})
        order = list(live)
        rng.shuffle(order)
        if rng.random() < 0.5:
            window = rng.randrange(1, 4)
            out = e.draft("s", 0, window, [RowStep(r, live[r].pending, live[r].params, 0, live[r].rollback)
                                           for r in order])
            for r, tokens in zip(order, out.tokens):
                back = rng.randrange(0, window)      # the state holds pending + tokens[:-1]; drop some of those
                live[r].generated += tokens
                live[r].pending, live[r].rollback = tokens[window - 1 - back:], back
        else:
            proposals = {r: [rng.randrange(1, 64) for _ in range(rng.randrange(0, 4))] for r in order}
            for r in order:   # a proposal that starts right, sometimes
                if proposals[r] and rng.random() < 0.5:
                    proposals[r][0] = alone[r][len(live[r].generated)]
            out = e.verify("s", 1, [VerifyRow(r, live[r].pending, live[r].params, 0, live[r].rollback,
                                              proposal=proposals[r]) for r in order], hand_up=False)
            for r, tokens, accepted in zip(order, out.tokens, out.accepted):
                live[r].generated += tokens
                live[r].pending, live[r].rollback = tokens[-1:], len(proposals[r]) - accepted
        leaving = [r for r in live if len(live[r].generated) >= wanted[r]]
        if leaving:
            e.release("s", leaving)
            done.update({r: live.pop(r).generated for r in leaving})
    assert e.state_ids() == []
    assert sorted(done) == sorted(prompts)
    for r, generated in done.items():
        assert generated == alone[r][: len(generated)], r


def test_target_only_sampling_draws_from_the_full_precision_distribution() -> None:
    """A target decoding alone draws its tokens from its own full-precision distribution, not from the rows
    rounded for the wire: for seeds whose first uniform falls where the two distributions' CDFs part, the
    engine's tokens are the full-precision draws (and the rounded draw would differ from the first token)."""
    from specrouter.worker import rows as wire
    from specrouter.worker.sampling import BatchSampling, next_token_probs, row_uniforms, sample

    e = engine()
    model, prompt, window, new = e.forward.model, [5, 9, 3, 17, 2], 4, 8
    params = SamplingParams(temperature=1.0)

    def probs(tokens: list[int], p: SamplingParams) -> torch.Tensor:   # [1, V]: the target's next-token distribution
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[:, -1]
        return next_token_probs(logits, BatchSampling([p], torch.device("cpu")), None)

    first = probs(prompt, params)
    rounded = wire.as_probs(wire.to_wire(first))
    u = torch.cat([row_uniforms(s, 0, 0, 1) for s in range(40_000)])                    # [S]
    apart = sample(first.expand(len(u), -1), u) != sample(rounded.expand(len(u), -1), u)
    seeds = apart.nonzero().flatten().tolist()
    assert len(seeds) >= 2, "no seed separates the full-precision draw from the rounded one; widen the search"
    for seed in seeds[:4]:
        p = SamplingParams(temperature=1.0, seed=seed)
        expected = list(prompt)
        for j in range(new):   # a target-only cycle c draws its i-th token with uniform i of stream (seed, c, 0)
            u = row_uniforms(seed, j // window, 0, window)[j % window : j % window + 1]
            expected.append(sample(probs(expected, p), u).item())
        batch = ChainBatch({"t": e}, "t", 256)
        batch.add([Row("r", list(prompt), len(prompt), p, new)])
        done = run_to_completion(batch, lambda _: (("t",), window))
        assert done["r"].generated == expected[len(prompt):], f"seed {seed}"
