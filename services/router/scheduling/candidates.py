"""What the scheduler chooses among: chains of the pool's models ending at the target, and the ordered
pairs (drafter, verifier) a chain's levels check, kept apart per decoding mode."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from specrouter.contract.measures import Mode

Pair = tuple[str, str, Mode]   # (drafter, verifier, mode)


def candidate_chains(models: Sequence[str], target: str, max_levels: int,
                     levels: Sequence[str] = (), growing: bool = True) -> list[tuple[str, ...]]:
    """Every chain of distinct models ending at the target, shortest first, then the same with each of
    `levels` (model-free drafters, which can only start a chain) in front, within `max_levels` levels.
    With `growing`, only chains whose models grow towards the target (`models` come smallest first): a
    verifier smaller than its drafter can only cut the proposal short with a weaker model's guesses, and
    such chains cost the scheduler plans and exploration cycles for nothing."""
    others = [m for m in models if m != target]
    pick = itertools.combinations if growing else itertools.permutations
    chains = []
    for n in range(0, min(len(others), max_levels - 1) + 1):
        chains += [(*p, target) for p in pick(others, n)]
    return chains + [(level, *c) for level in levels for c in chains if len(c) < max_levels]


def chain_pairs(chain: Sequence[str]) -> list[tuple[str, str]]:
    """The (drafter, verifier) of each verifying level, from the first."""
    return list(zip(chain[:-1], chain[1:]))


def mode_of(row) -> Mode:
    """A row's decoding mode, from its sampling parameters: greedy, speculative sampling, or coupled."""
    if row.sampling.greedy:
        return Mode.GREEDY
    return Mode.COUPLED if row.sampling.coupled else Mode.SAMPLING
