"""Shared fixtures: tiny random Llama models (no weights to load) and the shipped demo pool."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specrouter.worker.engine import WorkerEngine
from specrouter.worker.forward import ModelForward

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_POOL = REPO_ROOT / "models" / "demo-pool"

TINY_VOCAB = 64


def tiny_llama(seed: int, hidden: int, layers: int, vocab: int = TINY_VOCAB, sharpness: float = 1.0) -> LlamaForCausalLM:
    """A random Llama; `sharpness` scales the output head so next-token distributions are peaked."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model


# the tiny pool's models: seed, hidden size, layers
TINY_SHAPES = {"s": (1, 16, 1), "m": (2, 32, 2), "t": (3, 64, 2)}


def tiny_engines(vocab: int = TINY_VOCAB, sharpness: float = 1.0) -> dict[str, WorkerEngine]:
    """A three-model pool: drafter `s`, intermediate `m`, target `t`."""
    return {name: WorkerEngine(name, ModelForward(tiny_llama(seed, h, l, vocab, sharpness)))
            for name, (seed, h, l) in TINY_SHAPES.items()}


@pytest.fixture(scope="session")
def tiny_pool() -> dict[str, WorkerEngine]:
    return tiny_engines()


@pytest.fixture(scope="session")
def twin() -> WorkerEngine:
    """A copy of the tiny pool's target: as a drafter it proposes exactly the target's greedy tokens."""
    return WorkerEngine("twin", ModelForward(tiny_llama(*TINY_SHAPES["t"])))


from tests.redis_server import redis_factory, shared_redis  # noqa: E402,F401  (fixtures for every test)
