"""The candidates: every chain of the pool ending at the target whose models grow towards it."""

from __future__ import annotations

from specrouter.router.scheduling.candidates import candidate_chains
from tests.router.scheduling.fakes import Clock, FakeBatch, make


def test_candidates_are_every_chain_ending_at_the_target_whose_models_grow() -> None:
    """The models come smallest first; a chain in which a smaller model verifies a larger one's drafts is
    a candidate only when the settings ask for every order."""
    assert candidate_chains(["a", "b", "t"], "t", max_levels=4) == [("t",), ("a", "t"), ("b", "t"), ("a", "b", "t")]
    assert candidate_chains(["a", "b", "t"], "t", max_levels=4, growing=False) == [
        ("t",), ("a", "t"), ("b", "t"), ("a", "b", "t"), ("b", "a", "t")]
    assert candidate_chains(["a", "b", "t"], "t", max_levels=2) == [("t",), ("a", "t"), ("b", "t")]


def test_the_scheduler_never_plans_nor_explores_a_chain_whose_models_shrink() -> None:
    """With every pair measured long ago (so that each is due an exploration cycle), no decision runs a
    chain in which `b` drafts for `a`, and no plan ranks one; with growing_chains off, plans rank them."""
    pairs = {("a", "t"): 0.8, ("b", "t"): 0.8, ("a", "b"): 0.8, ("b", "a"): 0.8}
    clock = Clock()
    sched, _ = make(pairs, clock, explore_after_s=0.0, explore_every_cycles=1)
    batch = FakeBatch(1)
    chosen = set()
    for _ in range(40):
        clock.now += 1
        chosen.add(sched.choose(batch)[0])
    assert ("b", "a", "t") not in chosen and ("a", "b", "t") in chosen, chosen
    assert all(p.chain != ("b", "a", "t") for p in sched.plan(1, 0).predictions)
    every, _ = make(pairs, Clock(), growing_chains=False)
    assert any(p.chain == ("b", "a", "t") for p in every.plan(1, 0).predictions)
