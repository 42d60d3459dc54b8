"""`specrouter bench`'s transformers peers (`report.peers`) against a hand-rolled greedy loop on tiny random
Llamas: the router's encoding, stopping and limits, target-only, assisted and batched generation, dtypes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specrouter.report import peers as hf
from tests.report.bench_fakes import save_tiny_pool


@pytest.fixture(scope="module")
def tiny_pool(tmp_path_factory) -> Path:
    return save_tiny_pool(tmp_path_factory.mktemp("tiny-pool"))


@pytest.fixture(scope="module")
def peers(tiny_pool: Path) -> hf.PeerModels:
    return hf.PeerModels.load(tiny_pool)


def _greedy_loop(model, prompt: list[int], n: int, eos: int | None) -> list[int]:
    """Greedy decoding by hand: the whole sequence through the model at every step, argmax of the last."""
    tokens = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([tokens])).logits   # [1, len, vocab]
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] == eos:
                break
    return tokens[len(prompt):]


PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, x):"]


def test_peers_encode_as_the_router_does(peers: hf.PeerModels) -> None:
    ids = peers.encode(PROMPTS[0])
    assert ids == peers.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    assert ids[0] != peers.tokenizer.bos_token_id
    assert peers.drafters() == ["d"] and peers.target == "t"


def test_target_only_generate_gives_the_greedy_loops_tokens(peers: hf.PeerModels) -> None:
    target = peers.models["t"]
    for text in PROMPTS:
        ids = peers.encode(text)
        want = _greedy_loop(target, ids, 12, peers.eos_token_id)
        assert hf.generate_target(peers, ids, 12) == want
        assert hf.generate_assisted(peers, "d", ids, 12) == want


class _StopAt(hf.PeerModels):
    """The same models with another EOS id: where a generation stops is then known in advance."""

    def __init__(self, peers: hf.PeerModels, eos: int):
        super().__init__(peers.tokenizer, peers.models, peers.target)
        self._eos = eos

    @property
    def eos_token_id(self) -> int:
        return self._eos


def test_the_peers_stop_at_eos_and_keep_it_as_the_router_does(peers: hf.PeerModels) -> None:
    ids = peers.encode(PROMPTS[1])
    free = _greedy_loop(peers.models["t"], ids, 12, None)
    eos = free[5]
    stopped = free[: free.index(eos) + 1]
    stopping = _StopAt(peers, eos)
    assert hf.generate_target(stopping, ids, 12) == stopped
    assert hf.generate_assisted(stopping, "d", ids, 12) == stopped
    assert hf.generate_batched(stopping, [ids, peers.encode(PROMPTS[0])], 12)[0] == stopped


def test_batched_generate_left_pads_and_gives_each_rows_greedy_tokens(peers: hf.PeerModels) -> None:
    prompts = [peers.encode(t) for t in PROMPTS]
    ids, mask = hf.left_pad(prompts, pad=0)
    longest = max(map(len, prompts))
    assert ids.shape == mask.shape == (3, longest)
    assert mask[0].tolist() == [0] * (longest - len(prompts[0])) + [1] * len(prompts[0])
    want = [_greedy_loop(peers.models["t"], p, 10, peers.eos_token_id) for p in prompts]
    assert hf.generate_batched(peers, prompts, 10) == want


def test_room_and_trim_follow_the_routers_limits() -> None:
    assert hf.room(prompt_len=10, max_new_tokens=64, context_length=32) == 21   # stops at 31 tokens held
    assert hf.room(prompt_len=40, max_new_tokens=64, context_length=32) == 0
    assert hf.trim_at_eos([5, 6, 0, 0, 0], eos=0, limit=4) == [5, 6, 0]
    assert hf.trim_at_eos([5, 6, 7], eos=0, limit=2) == [5, 6]


def test_peers_load_in_the_dtype_asked_and_decode_greedily_in_it(tiny_pool: Path) -> None:
    half = hf.PeerModels.load(tiny_pool, device="cpu", dtype="bfloat16")
    assert {p.dtype for m in half.models.values() for p in m.parameters()} == {torch.bfloat16}
    prompt = half.encode("def parse(line):\n    return")
    assert hf.generate_target(half, prompt, 6) == _greedy_loop(half.models[half.target], prompt, 6, half.eos_token_id)
