"""On the shipped demo pool: every chain ending at the target (and the lookup level before the smallest
drafter or the target alone), windows 1, 3 and 6, batches of 1 and 4 with prompts of different lengths,
emits exactly target-only greedy decoding (the first GRID_PROMPTS of 30 held-out prompts x 64 new tokens
at batch 4, the first BATCH_1_PROMPTS of them one at a time; target-only in blocks over all 30), in fp32."""

from __future__ import annotations

import itertools

import pytest
import torch

from specrouter.pool.prompts import heldout_code_prompts
from specrouter.router.chain import TARGET_ONLY_BLOCK
from specrouter.router.lookup import LOOKUP
from specrouter.inprocess import InProcessPool
from specrouter.contract.calls import SamplingParams
from tests.conftest import DEMO_POOL

PROMPTS = 30
NEW_TOKENS = 64
WINDOWS = [1, 3, 6]
BATCH_SIZES = [1, 4]
BATCH_1_PROMPTS = 6    # one at a time, every prompt's cycles are the batch's: fewer prompts check as much
GRID_PROMPTS = 16      # at batch 4, for every chain and window: four batches of rows of different lengths


@pytest.fixture(scope="module")
def pool() -> InProcessPool:
    return InProcessPool.open(DEMO_POOL, dtype=torch.float32)


@pytest.fixture(scope="module")
def prompt_ids(pool) -> list[list[int]]:
    return [pool.encode(p) for p in heldout_code_prompts(PROMPTS)]


def greedy(pool: InProcessPool, prompts, chain, window, batch_size) -> list[list[int]]:
    out = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        rows = pool.generate_ids(chunk, chain, window, [SamplingParams()] * len(chunk), NEW_TOKENS)
        out.extend(r.generated for r in rows)
    return out


@pytest.fixture(scope="module")
def reference(pool, prompt_ids) -> list[list[int]]:
    return greedy(pool, prompt_ids, (pool.target,), 1, 1)


def all_chains(pool: InProcessPool) -> list[tuple[str, ...]]:
    """Every chain ending at the target: all subsets of the other models, in size order."""
    others = [m for m in pool.by_size() if m != pool.target]
    return [(*subset, pool.target) for n in range(1, len(others) + 1) for subset in itertools.combinations(others, n)]


def lookup_chains(pool: InProcessPool) -> list[tuple[str, ...]]:
    return [(LOOKUP, pool.target), (LOOKUP, pool.by_size()[0], pool.target)]


def test_prompts_have_different_lengths(prompt_ids) -> None:
    assert len({len(p) for p in prompt_ids}) > 10
    assert len({len(p) for p in prompt_ids[:GRID_PROMPTS]}) > 8


def test_target_only_equals_transformers_generate(pool, prompt_ids, reference) -> None:
    model = pool.engines[pool.target].forward.model
    eos = pool.tokenizer.eos_token_id
    for ids, ours in list(zip(prompt_ids, reference))[:5]:
        x = torch.tensor([ids])
        hf = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False,
                            pad_token_id=eos, eos_token_id=eos)[0, len(ids):].tolist()
        assert ours == hf


@pytest.mark.slow   # every chain of the pool at every window: the fast path keeps target-only and the router's statics
@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_every_chain_and_window_is_exact(pool, prompt_ids, reference, batch_size) -> None:
    assert len(all_chains(pool)) >= 3
    prompts = prompt_ids[:BATCH_1_PROMPTS] if batch_size == 1 else prompt_ids[:GRID_PROMPTS]
    for chain, window in itertools.product(all_chains(pool) + lookup_chains(pool), WINDOWS):
        got = greedy(pool, prompts, chain, window, batch_size)
        mismatched = [i for i, (a, b) in enumerate(zip(got, reference)) if a != b]
        assert not mismatched, f"chain {chain} window {window} batch {batch_size}: prompts {mismatched} differ"
    assert all(not e.state_ids() for e in pool.engines.values())


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_target_only_in_blocks_is_exact(pool, prompt_ids, reference, batch_size) -> None:
    """With the window left open (0) the target samples TARGET_ONLY_BLOCK tokens a call; rows that stop
    inside a block (EOS, or a token budget that is no multiple of the block) drop the rest of it."""
    assert greedy(pool, prompt_ids, (pool.target,), 0, batch_size) == reference
    budget = NEW_TOKENS - 1 - TARGET_ONLY_BLOCK // 2
    chunk = prompt_ids[:batch_size]
    rows = pool.generate_ids(chunk, (pool.target,), 0, [SamplingParams()] * len(chunk), budget)
    assert [r.generated for r in rows] == [ref[:budget] for ref in reference[:batch_size]]
    assert all(not e.state_ids() for e in pool.engines.values())
