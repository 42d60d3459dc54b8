"""Sampling through a three-level chain emits exactly the target's distribution.

Vocabulary of 8, two new tokens: the target's joint distribution over the 64 outcomes is computed
exactly from its logits and compared with the chain's output over many seeds (one row per seed).
Each assertion is a chi-square test at P_THRESHOLD, its false-positive rate.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.row import Row
from specrouter.contract.calls import SamplingParams
from tests.conftest import tiny_engines
from tests import stats
from tests.stats import chi_square_p_value

VOCAB = 8
PROMPT = [1, 2, 3]
NEW_TOKENS = 2
SAMPLES = 6000
P_THRESHOLD = 1e-4


@pytest.fixture(scope="module")
def engines():
    return tiny_engines(vocab=VOCAB, sharpness=8.0)  # peaked, disagreeing distributions


def exact_joint(model, params: SamplingParams, prompt: list[int] = PROMPT) -> torch.Tensor:
    """P(a, b | prompt) under the target with the request's processors: [VOCAB, VOCAB]."""
    return stats.exact_joint(model, params, prompt, NEW_TOKENS)


def sample_chain(engines, chain, window, params: SamplingParams, prompt: list[int] = PROMPT,
                 on_cycle=None) -> torch.Tensor:
    """Counts [VOCAB, VOCAB] of the two new tokens of SAMPLES rows, one seed each, through `chain`."""
    batch = ChainBatch(engines, "t", context_length=256)
    batch.add([Row(f"r{i}", list(prompt), len(prompt), dataclasses.replace(params, seed=i), NEW_TOKENS)
               for i in range(SAMPLES)])
    done = run_to_completion(batch, lambda _: (chain, window), on_cycle)
    counts = torch.zeros(VOCAB, VOCAB)
    for row in done.values():
        a, b = row.generated
        counts[a, b] += 1
    return counts


class WrongRows:
    """A worker whose verify is handed rows shifted by one position: a deliberately broken chain."""

    def __init__(self, engine):
        self.engine, self.name = engine, engine.name

    def __getattr__(self, item):
        return getattr(self.engine, item)

    def verify(self, state_id, level, rows, hand_up):
        broken = [dataclasses.replace(r, proposal_rows=None if r.proposal_rows is None else r.proposal_rows.roll(1, 0))
                  for r in rows]
        return self.engine.verify(state_id, level, broken, hand_up)


PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.2)]
COUPLED = [dataclasses.replace(p, coupled=True) for p in PARAMS]   # Gumbel-max picks checked by equality


@pytest.mark.parametrize("params", PARAMS + COUPLED, ids=["plain", "processors", "coupled", "coupled-processors"])
def test_three_level_chain_matches_the_target(engines, params) -> None:
    expected = exact_joint(engines["t"].forward.model, params)
    counts = sample_chain(engines, ("s", "m", "t"), window=2, params=params)
    assert chi_square_p_value(counts, expected) > P_THRESHOLD


def test_the_same_test_fails_for_a_broken_verifier(engines) -> None:
    params = PARAMS[0]
    expected = exact_joint(engines["t"].forward.model, params)
    broken = dict(engines, m=WrongRows(engines["m"]))
    counts = sample_chain(broken, ("s", "m", "t"), window=2, params=params)
    assert chi_square_p_value(counts, expected) < P_THRESHOLD


def test_drafter_distribution_differs_from_the_target(engines) -> None:
    """Guards the tests above: the chain has something to correct (drafter != target)."""
    params = PARAMS[0]
    target = exact_joint(engines["t"].forward.model, params)
    drafter = exact_joint(engines["s"].forward.model, params)
    assert 0.5 * (target - drafter).abs().sum() > 0.2


# -- coupled sampling: the same tokens whatever the chain ----------------------------------------------


def test_the_coupled_test_fails_at_a_wrong_temperature(engines) -> None:
    """Power control: the chain sampled at temperature 1.3 is told apart from the target at 1.0."""
    expected = exact_joint(engines["t"].forward.model, COUPLED[0])
    counts = sample_chain(engines, ("s", "m", "t"), window=2, params=dataclasses.replace(COUPLED[0], temperature=1.3))
    assert chi_square_p_value(counts, expected) < P_THRESHOLD


@pytest.mark.parametrize("params", COUPLED, ids=["plain", "processors"])
def test_a_coupled_seed_gives_the_same_tokens_under_every_chain_and_window(engines, params) -> None:
    """Seeds past 2**32 included: 64 rows, 8 new tokens each, one batch per configuration."""
    def tokens(chain, window) -> dict[int, list[int]]:
        batch = ChainBatch(engines, "t", context_length=256)
        seeds = [i * 2**40 + 3 * i for i in range(64)]
        batch.add([Row(f"r{i}", list(PROMPT), len(PROMPT), dataclasses.replace(params, seed=seed), 8)
                   for i, seed in enumerate(seeds)])
        done = run_to_completion(batch, lambda _: (chain, window))
        return {i: done[f"r{i}"].generated for i in range(len(seeds))}

    reference = tokens(("t",), 1)
    assert len({tuple(t) for t in reference.values()}) > 16   # the seeds make different texts
    for chain, window in [(("t",), 0), (("t",), 3), (("s", "t"), 1), (("s", "t"), 4), (("m", "t"), 2),
                          (("s", "m", "t"), 3), (("s", "m", "t"), 6)]:
        assert tokens(chain, window) == reference, (chain, window)
