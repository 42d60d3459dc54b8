"""Rows joining an auto batch are prefilled on the models it runs; the others get them when a chain needs them.

A model left out of a row's prefill holds none of its state: the first cycle of a chain through it prefills
the rows it lacks, and the output stays the target's whichever chains ran. The scheduler prices that catch-up
as the prefill it is, and a row that leaves before any chain needed the model is never sent there at all.
"""

from __future__ import annotations

import random

import pytest

from specrouter.router.batcher import Batcher, RecentModels
from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.handles import Finished
from specrouter.router.requests import GenerationRequest
from specrouter.router.row import Row
from specrouter.router.running import BatchKey
from specrouter.router.scheduling.policy import catch_up_ns
from specrouter.contract.calls import SamplingParams
from tests.router.test_row_isolation import CONTEXT, engine, outcome

CHAINS = [("t",), ("s", "t"), ("m", "t"), ("s", "m", "t")]


class Recorded:
    """An engine of this process whose calls are written down: (operation, row ids)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prefill(self, state_id, rows, predictions=0):
        self.calls.append(("prefill", [r for r, _ in rows]))
        return self.inner.prefill(state_id, rows, predictions)

    def draft(self, state_id, level, window, rows, hand_up=True):
        self.calls.append(("draft", [r.row_id for r in rows]))
        return self.inner.draft(state_id, level, window, rows, hand_up)

    def verify(self, state_id, level, rows, hand_up):
        self.calls.append(("verify", [r.row_id for r in rows]))
        return self.inner.verify(state_id, level, rows, hand_up)

    def release(self, state_id, row_ids=None):
        self.calls.append(("release", None if row_ids is None else list(row_ids)))
        return self.inner.release(state_id, row_ids)


@pytest.fixture()
def pool() -> dict[str, Recorded]:
    return {name: Recorded(engine(name)) for name in ("s", "m", "t")}


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 64) for _ in range(rng.randrange(2, 12))] for _ in range(n)]


def target_only(pool, ps, max_new) -> dict[str, list[int]]:
    batch = ChainBatch(pool, "t", CONTEXT)
    batch.add([Row(f"r{i}", p, len(p), SamplingParams(), n) for i, (p, n) in enumerate(zip(ps, max_new))])
    return {r: row.generated for r, row in run_to_completion(batch, lambda _: (("t",), 1)).items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_left_out_of_a_models_prefill_emit_the_targets_tokens(pool, seed) -> None:
    """Rows join (and leave) a batch that prefills them on the drafter and the target alone, while the
    cycles switch at random between every chain and windows 1-6: the output is target-only's, the
    intermediate `m` sees a row first in a prefill of the first cycle through it, and no state is left."""
    rng = random.Random(seed)
    ps, max_new = prompts(6, seed), [rng.randrange(4, 24) for _ in range(6)]
    expected = target_only(pool, ps, max_new)
    for e in pool.values():
        e.calls.clear()

    rows = [Row(f"r{i}", p, len(p), SamplingParams(), n) for i, (p, n) in enumerate(zip(ps, max_new))]
    joins = {0: rows[:2], 1: rows[2:3], 4: rows[3:5], 7: rows[5:]}
    batch = ChainBatch(pool, "t", CONTEXT)
    batch.prefill_on = frozenset({"s"})
    out, cycle, m_ran = {}, 0, set()
    while batch.rows or joins:
        if cycle in joins:
            batch.add(joins.pop(cycle))
        if batch.rows:
            chain = rng.choice(CHAINS)
            m_calls = len(pool["m"].calls)
            report = batch.step(chain, rng.randrange(1, 7))
            new = pool["m"].calls[m_calls:]
            lacking = sorted(set(batch.rows) - m_ran) if "m" in chain else []
            if "m" in chain:
                # the rows m lacked are prefilled first, then the cycle's call covers every running row
                assert new[0] == ("prefill", lacking) if lacking else new[0][0] != "prefill"
                m_ran |= set(batch.rows)
            else:
                assert new == []
            # the cycle reports that prefill's time apart, so it is not taken for the router's cost of a cycle
            assert (report.late_prefill_ns > 0) == bool(lacking)
        finished = [r for r, row in batch.rows.items() if row.finish_reason]
        out.update({row.row_id: row.generated for row in batch.remove(finished)})
        cycle += 1
    assert out == expected
    # a row is released only where it was prefilled
    released = {r for op, ids in pool["m"].calls if op == "release" for r in ids}
    assert released <= m_ran
    assert all(not e.state_ids() for e in pool.values())


def test_a_left_out_models_catch_up_is_priced_as_its_prefill(pool) -> None:
    """Until a chain through it runs, a left-out model has seen none of the row: `catch_up_ns` prices the
    whole row's tokens on it, as the plan's latency of that many, and nothing once it has run."""
    batch = ChainBatch(pool, "t", CONTEXT)
    batch.prefill_on = frozenset({"s"})
    row = Row("r0", list(range(1, 21)), 20, SamplingParams(), 8)
    batch.add([row])
    assert row.seen == {"s": 19, "m": 0, "t": 19}

    class Plan:   # a latency linear in the tokens fed
        @staticmethod
        def latency(model, rows, tokens):
            return 1000.0 * tokens

    assert catch_up_ns(Plan, ("s", "t"), [row]) == 0
    assert catch_up_ns(Plan, ("m", "t"), [row]) == 1000.0 * (20 - 1)
    batch.step(("m", "t"), 2)
    assert catch_up_ns(Plan, ("m", "t"), [row]) == 0
    batch.release()
    assert all(not e.state_ids() for e in pool.values())


def test_recent_models_are_those_run_within_the_last_cycles() -> None:
    recent, key, other = RecentModels(3), BatchKey(None, 0), BatchKey(None, 3)
    assert recent.recent(key) is None   # before any cycle: every model
    recent.ran(key, ("s", "m", "t"))
    recent.ran(key, ("s", "t"))
    recent.ran(key, ("s", "t"))
    assert recent.recent(key) == {"s", "m", "t"}
    recent.ran(key, ("t",))
    assert recent.recent(key) == {"s", "t"}
    assert recent.recent(other) is None
    assert RecentModels(0).recent(key) is None


class Fixed:
    """A chooser that runs the drafter and the target at window 3, whatever is asked."""

    def choose(self, batch, chain, window):
        return ("s", "t"), 3

    def decision_for(self, batch):
        return None


def test_auto_requests_after_the_first_skip_the_model_the_chooser_never_runs(pool) -> None:
    """Through the batcher: the first auto request is prefilled on every model (nothing ran yet), the ones
    after it only on the models its cycles ran; their tokens are the target's."""
    ps = prompts(3, 5)
    expected = target_only(pool, ps, [12, 12, 12])
    for e in pool.values():
        e.calls.clear()
    batcher = Batcher(pool, "t", CONTEXT, None, chooser=Fixed(), prefill_recent_cycles=8)
    batcher.start()
    try:
        outcomes = [outcome(batcher.submit(GenerationRequest(p, SamplingParams(), 12))) for p in ps]
    finally:
        batcher.stop()
    assert all(isinstance(o, Finished) for o in outcomes)
    assert [o.token_ids for o in outcomes] == [expected[f"r{i}"] for i in range(3)]
    prefills = {name: sum(op == "prefill" for op, _ in e.calls) for name, e in pool.items()}
    assert prefills == {"s": 3, "m": 1, "t": 3}
    assert all(not e.state_ids() for e in pool.values())


def test_sampled_rows_left_out_of_a_models_prefill_draw_what_they_would_have(pool) -> None:
    """A model's state of a row is a function of its tokens, whenever it was prefilled: seeded sampled rows
    draw the same tokens whether the intermediate got them at join or at the first cycle through it."""
    ps = prompts(4, 9)
    params = [SamplingParams(temperature=0.9, seed=5), SamplingParams(temperature=1.1, top_k=8, seed=6),
              SamplingParams(temperature=0.7, top_p=0.8, repetition_penalty=1.1, seed=7), SamplingParams()]

    def run(prefill_on) -> dict[str, list[int]]:
        rng = random.Random(4)
        rows = [Row(f"r{i}", p, len(p), s, 16) for i, (p, s) in enumerate(zip(ps, params))]
        joins = {0: rows[:2], 3: rows[2:]}
        batch = ChainBatch(pool, "t", CONTEXT)
        batch.prefill_on = prefill_on
        out, cycle = {}, 0
        while batch.rows or joins:
            if cycle in joins:
                batch.add(joins.pop(cycle))
            if batch.rows:
                batch.step(rng.choice(CHAINS), rng.randrange(1, 5))
            out.update({r.row_id: r.generated for r in batch.remove([r for r, row in batch.rows.items()
                                                                      if row.finish_reason])})
            cycle += 1
        assert all(not e.state_ids() for e in pool.values())
        return out

    assert run(frozenset({"s"})) == run(None)


class Switching:
    """A chooser that runs the drafter and the target until `late` is set, then adds the intermediate (while
    the batch has it, as the router's choosers do)."""

    late = False

    def choose(self, batch, chain, window):
        return (("s", "m", "t") if self.late and "m" in batch.workers else ("s", "t")), 3

    def decision_for(self, batch):
        return None


def test_a_late_prefill_that_fails_costs_the_model_not_the_requests(pool) -> None:
    """The intermediate's late prefill of a row (the first cycle through it after the row joined) fails: the
    batch goes on without it, and every request ends with the target's tokens."""
    ps = prompts(2, 8)
    expected = target_only(pool, ps, [12, 12])

    tried = []

    def failing_late_prefill(state_id, rows, predictions=0):
        tried.append([r for r, _ in rows])
        raise ConnectionError("worker m is gone")

    chooser = Switching()
    batcher = Batcher(pool, "t", CONTEXT, None, chooser=chooser, prefill_recent_cycles=4)
    batcher.start()
    try:
        first = outcome(batcher.submit(GenerationRequest(ps[0], SamplingParams(), 12)))
        pool["m"].prefill = failing_late_prefill   # the second request joins without m, which then fails it
        chooser.late = True
        second = outcome(batcher.submit(GenerationRequest(ps[1], SamplingParams(), 12)))
    finally:
        batcher.stop()
    assert len(tried) == 1 and len(tried[0]) == 1   # the second request's row, late, and m was dropped after it
    assert isinstance(first, Finished) and isinstance(second, Finished)
    assert [first.token_ids, second.token_ids] == [expected["r0"], expected["r1"]]
    del pool["m"].prefill
    assert all(not e.state_ids() for e in pool.values())
