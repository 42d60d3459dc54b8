"""A drafter drafting for one row feeds guesses from the row's own history with each drafted token and keeps
those that are its own argmax: the same drafts as one pass a token, in fewer passes."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from specrouter.report import workloads
from specrouter.worker import lookahead
from specrouter.contract.calls import RowStep, SamplingParams
from specrouter.worker.engine import EngineSettings, WorkerEngine
from specrouter.worker.forward import ModelForward
from tests.conftest import DEMO_POOL

DRAFTER = DEMO_POOL / "stdlib-1m"


def test_a_guess_follows_the_latest_occurrence_of_the_longest_suffix() -> None:
    ctx = np.array([5, 1, 2, 9, 7, 2, 8, 3, 1, 2])
    # suffix [1, 2] occurs at 1..2 (followed by 9, 7); [2] alone last occurred at 5 (followed by 8)
    assert lookahead.guess(ctx, 3) == [9, 7, 2]
    assert lookahead.guess(ctx, 1) == [9]
    assert lookahead.guess(np.array([4, 6, 4, 6, 4]), 5) == [6, 4]          # the latest: position 2
    assert lookahead.guess(np.array([1, 2, 3]), 4) == []                    # 3 never occurred before
    assert lookahead.guess(np.array([3, 3]), 4) == [] and lookahead.guess(np.array([3, 3]), 4, shortest=1) == [3]
    # a suffix of one token only: no guess, unless one token is enough
    assert lookahead.guess(np.array([7, 1, 9, 5, 1]), 4) == []
    assert lookahead.guess(np.array([7, 1, 9, 5, 1]), 4, shortest=1) == [9, 5, 1]
    assert lookahead.guess(ctx, 0) == [] and lookahead.guess(np.array([7]), 3) == []


@pytest.fixture(scope="module")
def drafter() -> ModelForward:
    # float64: a block of k tokens and k single-token passes agree far below any argmax tie
    return ModelForward(AutoModelForCausalLM.from_pretrained(DRAFTER, dtype=torch.float64))


@pytest.fixture(scope="module")
def repetitive_prompts() -> list[list[int]]:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(DRAFTER)
    return [tokenizer(p.prompt)["input_ids"] for p in workloads.builtin_prompts(4) if p.kind == workloads.REPETITIVE]


def drafts(e: WorkerEngine, prompt: list[int], window: int, cycles: int, seed: int) -> tuple[list[list[int]], int]:
    """Drafts of `cycles` cycles of one row, each followed by a verdict drawn at random (some drafts accepted,
    then a correction), as a router would send them; returns the drafts, checking the row's tokens after
    every call, and the passes they took."""
    rng = random.Random(seed)
    e.prefill("s", [("r", prompt[:-1])])
    pending, rollback, out, passes = [prompt[-1]], 0, [], 0
    held = list(prompt[:-1])
    for cycle in range(cycles):
        result = e.draft("s", 0, window, [RowStep("r", pending, SamplingParams(), cycle, rollback)])
        (drafted,) = result.tokens
        out.append(drafted)
        passes += len(result.timings)
        held = held[:len(held) - rollback] + pending + drafted[:-1]
        assert e.state("s").row_tokens(0) == held            # pending + the first W - 1 drafts, as always
        accepted = rng.randint(0, window)
        correction = rng.randrange(4, 200)
        if accepted == window:
            pending, rollback = [drafted[-1], correction], 0
        else:
            pending, rollback = [correction], window - 1 - accepted
    e.release("s")
    return out, passes


@pytest.mark.parametrize("window", [2, 5, 8])
def test_one_row_drafts_the_same_tokens_in_fewer_passes(drafter, repetitive_prompts, window) -> None:
    plain = WorkerEngine("d", drafter, EngineSettings(draft_lookahead=0))
    ahead = WorkerEngine("d", drafter, EngineSettings(draft_lookahead=4))
    plain_passes = ahead_passes = 0
    for i, prompt in enumerate(repetitive_prompts):
        expected, n = drafts(plain, prompt, window, cycles=10, seed=i)
        got, m = drafts(ahead, prompt, window, cycles=10, seed=i)
        assert got == expected
        assert n == 10 * window
        plain_passes, ahead_passes = plain_passes + n, ahead_passes + m
    if window == 2:   # the one pass after the first drafted token has no room for a guess
        assert ahead_passes == plain_passes
    else:             # text that repeats itself: guesses come true, though the corrections are random
        assert ahead_passes < plain_passes


def test_several_rows_or_sampled_rows_draft_one_pass_a_token(drafter, repetitive_prompts) -> None:
    e = WorkerEngine("d", drafter, EngineSettings(draft_lookahead=4))
    a, b = repetitive_prompts[:2]
    e.prefill("two", [("a", a[:-1]), ("b", b[:-1])])
    two = e.draft("two", 0, 6, [RowStep("a", [a[-1]], SamplingParams(), 0), RowStep("b", [b[-1]], SamplingParams(), 0)])
    assert len(two.timings) == 6
    e.prefill("sampled", [("a", a[:-1])])
    sampled = e.draft("sampled", 0, 6, [RowStep("a", [a[-1]], SamplingParams(temperature=0.7, seed=3), 0)])
    assert len(sampled.timings) == 6 and sampled.rows[0].shape[0] == 6
