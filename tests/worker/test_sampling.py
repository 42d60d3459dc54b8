"""Logits processors agree with Hugging Face's; sampling and random streams are deterministic."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specrouter.contract.calls import SamplingParams
from specrouter.worker.sampling import (BatchSampling, key_uniforms, next_token_probs, row_uniforms, sample,
                                       stream_key, token_presence)
from tests.stats import chi_square_p_value

VOCAB = 50


def hf_probs(logits: torch.Tensor, history: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    scores = logits.clone()
    if p.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(history, scores)
    if p.greedy:
        return torch.nn.functional.one_hot(scores.argmax(-1), VOCAB).float()
    scores = TemperatureLogitsWarper(p.temperature)(history, scores)
    if p.top_k:
        scores = TopKLogitsWarper(p.top_k)(history, scores)
    if p.top_p < 1.0:
        scores = TopPLogitsWarper(p.top_p)(history, scores)
    return scores.softmax(-1)


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, top_k=10, top_p=0.6, repetition_penalty=1.5),
])
def test_processors_match_hugging_face(params: SamplingParams) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, VOCAB, generator=gen) * 3
    history = torch.randint(0, VOCAB, (8, 12), generator=gen)
    presence = token_presence(history, torch.ones_like(history, dtype=torch.bool), VOCAB)
    ours = next_token_probs(logits, BatchSampling([params] * 8, torch.device("cpu")), presence)
    torch.testing.assert_close(ours, hf_probs(logits, history, params), atol=1e-6, rtol=1e-5)


def test_rows_of_one_batch_keep_their_own_parameters() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(), SamplingParams(temperature=1.0, top_k=3), SamplingParams(temperature=0.5)]
    mixed = next_token_probs(logits, BatchSampling(params, torch.device("cpu")), None)
    for i, p in enumerate(params):
        alone = next_token_probs(logits[i : i + 1], BatchSampling([p], torch.device("cpu")), None)
        torch.testing.assert_close(mixed[i : i + 1], alone)


def test_inverse_cdf_sampling_follows_the_distribution() -> None:
    """False-positive rate 1e-3 (the p-value threshold)."""
    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05])
    n = 20_000
    tokens = sample(probs.expand(n, -1), torch.rand(n, generator=torch.Generator().manual_seed(2)))
    counts = torch.bincount(tokens, minlength=5)
    assert counts[1] == 0
    assert chi_square_p_value(counts, probs) > 1e-3


def test_random_streams_depend_on_seed_cycle_and_level_only() -> None:
    a = row_uniforms(seed=5, cycle=3, level=1, count=4)
    assert torch.equal(a, row_uniforms(5, 3, 1, 4))
    assert torch.equal(a[:2], row_uniforms(5, 3, 1, 2))
    for other in (row_uniforms(6, 3, 1, 4), row_uniforms(5, 4, 1, 4), row_uniforms(5, 3, 2, 4)):
        assert not torch.equal(a, other)
    assert bool(((a >= 0) & (a < 1)).all())


def test_random_streams_use_every_bit_of_their_key() -> None:
    """torch's CPU generator, seeded with a 64-bit key, draws from its low 32 bits alone."""
    key = 0x0123_4567_89AB_CDEF
    a = key_uniforms(key, 8)
    assert torch.equal(a, key_uniforms(key, 8))
    assert bool(((a >= 0) & (a < 1)).all())
    for bit in range(64):
        assert not torch.equal(a, key_uniforms(key ^ (1 << bit), 8)), f"bit {bit} of the key is not used"


def test_streams_of_one_request_whose_keys_share_their_low_32_bits_differ() -> None:
    """Seed 2024's streams at (cycle 11160, level 0) and (cycle 35516, level 1), found by a search: with a
    seeded torch generator they drew the same uniforms."""
    a, b = (2024, 11160, 0), (2024, 35516, 1)
    assert stream_key(*a) != stream_key(*b)
    assert stream_key(*a) % 2**32 == stream_key(*b) % 2**32
    assert not torch.equal(row_uniforms(*a, 8), row_uniforms(*b, 8))


def test_sampling_from_one_uniform_per_stream_follows_the_distribution() -> None:
    """The first uniform of 20,000 streams (cycles of one request) drives inverse-CDF sampling; the tokens
    follow the distribution. False-positive rate 1e-3 (the p-value threshold)."""
    probs = torch.tensor([0.4, 0.0, 0.25, 0.2, 0.1, 0.05])
    n = 20_000
    u = torch.stack([row_uniforms(7, cycle, 1, 1)[0] for cycle in range(n)])
    counts = torch.bincount(sample(probs.expand(n, -1), u), minlength=probs.numel())
    assert counts[1] == 0
    assert chi_square_p_value(counts, probs) > 1e-3


@pytest.mark.parametrize("bad", [
    SamplingParams(temperature=-0.1), SamplingParams(top_p=0.0), SamplingParams(top_p=1.5),
    SamplingParams(top_k=-1), SamplingParams(repetition_penalty=0.0),
])
def test_invalid_parameters_are_refused(bad: SamplingParams) -> None:
    with pytest.raises(ValueError):
        bad.validate()


# -- coupled sampling -----------------------------------------------------------------------------------

def test_coupled_picks_follow_the_distribution_over_seeds() -> None:
    """The Gumbel-max pick at one position, over 20,000 seeds (64-bit ones), follows the distribution, zeros
    never picked. False-positive rate 1e-3 (the p-value threshold)."""
    from specrouter.worker.sampling import coupled_pick, position_key

    probs = torch.tensor([0.4, 0.0, 0.25, 0.2, 0.1, 0.05])
    n = 20_000
    keys = [position_key(2**40 + seed, 17) for seed in range(n)]
    counts = torch.bincount(coupled_pick(probs.expand(n, -1), keys), minlength=probs.numel())
    assert counts[1] == 0
    assert chi_square_p_value(counts, probs) > 1e-3
    wrong = torch.tensor([0.3, 0.0, 0.3, 0.2, 0.15, 0.05])   # power control: a distribution 0.1 away
    assert chi_square_p_value(counts, wrong) < 1e-3


def test_coupled_noise_depends_on_the_seed_and_the_position_alone() -> None:
    import numpy as np

    from specrouter.worker.sampling import exponential_noise, position_key

    a = exponential_noise([position_key(5, 10), position_key(5, 11)], 32)
    assert np.array_equal(a, exponential_noise([position_key(5, 10), position_key(5, 11)], 32))
    assert not np.array_equal(a[0], a[1]) and (a > 0).all()
    # the upper 32 bits of a seed count: seeds that share their low 32 bits differ
    assert not np.array_equal(exponential_noise([position_key(7, 3)], 32), exponential_noise([position_key(7 + 2**32, 3)], 32))
    # the noise at a position does not depend on how many positions are asked for together
    assert np.array_equal(exponential_noise([position_key(9, 4)], 16)[0],
                          exponential_noise([position_key(9, 2), position_key(9, 4)], 16)[1])


def test_two_close_distributions_pick_alike_more_often_than_speculative_sampling_accepts() -> None:
    """Daliri et al.'s bound: with shared noise, two distributions at total variation d pick the same token
    with probability >= (1 - d) / (1 + d); measured over 20,000 seeds, within 4 standard errors."""
    from specrouter.worker.sampling import coupled_pick, position_key

    p = torch.tensor([0.5, 0.3, 0.1, 0.1])
    q = torch.tensor([0.3, 0.4, 0.2, 0.1])
    d = 0.5 * float((p - q).abs().sum())
    n = 20_000
    keys = [position_key(seed, 0) for seed in range(n)]
    same = float((coupled_pick(p.expand(n, -1), keys) == coupled_pick(q.expand(n, -1), keys)).double().mean())
    bound = (1 - d) / (1 + d)
    assert same > bound - 4 * (bound * (1 - bound) / n) ** 0.5


def test_coupled_noise_is_never_zero_even_at_the_top_of_its_range() -> None:
    """Noise 0 would turn a token of probability 0 into 0 / 0 and pick it: the largest word the hash can give
    must still make noise above 0."""
    import numpy as np

    from specrouter.worker.sampling import NOISE_BITS

    k = np.float32(2**NOISE_BITS - 1)
    u = (k + np.float32(0.5)) * np.float32(2.0 ** -NOISE_BITS)
    assert u < 1 and -np.log(u) > 0
