"""The candidates: every chain of the pool ending at the target."""

from __future__ import annotations

from specrouter.router.scheduling.candidates import candidate_chains


def test_candidates_are_every_chain_ending_at_the_target() -> None:
    chains = candidate_chains(["a", "b", "t"], "t", max_levels=4)
    assert chains == [("t",), ("a", "t"), ("b", "t"), ("a", "b", "t"), ("b", "a", "t")]
    assert candidate_chains(["a", "b", "t"], "t", max_levels=2) == [("t",), ("a", "t"), ("b", "t")]
