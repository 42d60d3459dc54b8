"""Fuzzing the sampling parameters in process: whatever a request carries, `SamplingParams.validate` refuses
it (ValueError, which both services turn into INVALID_ARGUMENT) or the logits processors make distributions
from it: finite, non-negative rows that sum to 1, and tokens inside the vocabulary."""

from __future__ import annotations

import math

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specrouter.contract.calls import SamplingParams
from specrouter.worker.sampling import BatchSampling, next_token_probs, sample, token_presence
from tests.fuzz.conftest import FAST
from tests.fuzz.strategies import INT32_MAX, INT32_MIN, floats32

VOCAB = 64
LOGIT_SCALES = [1.0, 30.0, 1e4]   # a model's logits, and far larger ones


@settings(FAST, max_examples=1000)   # in process: a thousand examples take a second
@given(temperature=floats32, top_p=floats32, top_k=st.integers(INT32_MIN, INT32_MAX), penalty=floats32,
       scale=st.sampled_from(LOGIT_SCALES), seed=st.integers(0, 2**16))
@example(temperature=1e-45, top_p=1.0, top_k=0, penalty=1.0, scale=30.0, seed=0)    # logits / T overflow
@example(temperature=1.0, top_p=1.0, top_k=0, penalty=1e-45, scale=30.0, seed=0)    # logits / penalty overflow
@example(temperature=math.inf, top_p=1.0, top_k=0, penalty=1.0, scale=1.0, seed=0)
@example(temperature=1.0, top_p=1.0, top_k=0, penalty=math.inf, scale=1.0, seed=0)  # 0 * inf for a zero logit
def test_parameters_are_refused_or_make_distributions(temperature, top_p, top_k, penalty, scale, seed) -> None:
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=penalty, seed=seed)
    try:
        params.validate()
    except ValueError as exc:
        assert str(exc)
        return
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, VOCAB, generator=gen) * scale                                  # [N, V]
    logits[0, 0] = 0.0   # an exact zero, which a penalty divides or multiplies
    history = torch.randint(0, VOCAB, (3, 8), generator=gen)
    presence = token_presence(history, torch.ones_like(history, dtype=torch.bool), VOCAB)
    probs = next_token_probs(logits, BatchSampling([params] * 3, torch.device("cpu")), presence)
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    assert torch.allclose(probs.sum(-1), torch.ones(3), atol=1e-4)
    tokens = sample(probs, torch.rand(3, generator=gen))
    assert ((0 <= tokens) & (tokens < VOCAB)).all() and (probs.gather(1, tokens[:, None]) > 0).all()
