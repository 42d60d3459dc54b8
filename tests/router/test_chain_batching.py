"""The chain runner on a tiny pool: exact greedy outputs, continuous batching, seeds, no leaks."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.row import Row, prompt_agreement
from specrouter.contract.calls import SamplingParams

CHAINS = [("t",), ("s", "t"), ("m", "t"), ("s", "m", "t")]
CONTEXT = 256


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 64) for _ in range(rng.randrange(1, 15))] for _ in range(n)]


def generate(engines, chain, window, rows: list[Row]) -> dict[str, list[int]]:
    batch = ChainBatch(engines, "t", CONTEXT)
    batch.add(rows)
    done = run_to_completion(batch, lambda _: (chain, window))
    assert all(not e.state_ids() for e in engines.values()), "a finished batch left worker state behind"
    return {r: row.generated for r, row in done.items()}


def new_row(i: int, prompt: list[int], params=SamplingParams(), max_new: int = 24) -> Row:
    return Row(f"r{i}", list(prompt), len(prompt), params, max_new)


def test_target_only_chain_is_plain_greedy_decoding(tiny_pool) -> None:
    target = tiny_pool["t"].forward.model
    for i, p in enumerate(prompts(3)):
        ours = generate(tiny_pool, ("t",), 1, [new_row(i, p)])[f"r{i}"]
        ids = torch.tensor([p])
        hf = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                             pad_token_id=0, eos_token_id=None)[0, len(p):].tolist()
        assert ours == hf


@pytest.mark.parametrize("chain,window", list(itertools.product(CHAINS[1:], [1, 3, 6])))
def test_every_chain_emits_the_targets_greedy_tokens(tiny_pool, chain, window) -> None:
    ps = prompts(4)
    reference = generate(tiny_pool, ("t",), 1, [new_row(i, p) for i, p in enumerate(ps)])
    assert generate(tiny_pool, chain, window, [new_row(i, p) for i, p in enumerate(ps)]) == reference


@pytest.mark.parametrize("chain,window", [(("s", "m", "t"), 3), (("s", "t"), 2)])
def test_rows_joining_and_leaving_keep_their_outputs(tiny_pool, chain, window) -> None:
    ps = prompts(5, seed=1)
    params = [SamplingParams(), SamplingParams(temperature=0.9, seed=11),
              SamplingParams(temperature=1.1, top_k=8, seed=12), SamplingParams(repetition_penalty=1.3),
              SamplingParams(temperature=0.7, top_p=0.8, repetition_penalty=1.1, seed=13)]
    max_new = [10, 30, 18, 25, 12]
    rows = lambda: [new_row(i, p, params[i], max_new[i]) for i, p in enumerate(ps)]  # noqa: E731
    alone = {}
    for row in rows():
        alone.update(generate(tiny_pool, chain, window, [row]))

    fresh = rows()
    joins = {0: fresh[:2], 2: fresh[2:3], 5: fresh[3:]}  # cycle -> rows joining before it
    together: dict[str, list[int]] = {}
    batch = ChainBatch(tiny_pool, "t", CONTEXT)
    cycle = 0
    while batch.rows or joins:
        if cycle in joins:
            batch.add(joins.pop(cycle))
        if batch.rows:
            batch.step(chain, window)
        finished = [r for r, row in batch.rows.items() if row.finish_reason]   # rows leave as they finish
        together.update({row.row_id: row.generated for row in batch.remove(finished)})
        cycle += 1
    assert together == alone
    assert all(not e.state_ids() for e in tiny_pool.values())


def test_same_seed_same_sample_and_different_seeds_differ(tiny_pool) -> None:
    p = prompts(1, seed=2)[0]
    outs = {}
    for seed in (1, 1, 2, 3):
        params = SamplingParams(temperature=1.0, seed=seed)
        outs.setdefault(seed, []).append(generate(tiny_pool, ("s", "m", "t"), 3, [new_row(0, p, params, 32)])["r0"])
    assert outs[1][0] == outs[1][1]
    assert len({tuple(outs[s][0]) for s in (1, 2, 3)}) == 3


def test_eos_stops_a_row_and_drops_what_follows(tiny_pool) -> None:
    p = prompts(1, seed=3)[0]
    free = generate(tiny_pool, ("s", "t"), 4, [new_row(0, p)])["r0"]
    stop = free[5]
    row = Row("r0", list(p), len(p), SamplingParams(), 24, stop_token_ids=frozenset({stop}))
    batch = ChainBatch(tiny_pool, "t", CONTEXT)
    batch.add([row])
    done = run_to_completion(batch, lambda _: (("s", "t"), 4))
    out = done["r0"]
    assert out.finish_reason == "stop"
    assert out.generated == free[: free.index(stop) + 1]


def test_bad_chains_are_refused(tiny_pool) -> None:
    batch = ChainBatch(tiny_pool, "t", CONTEXT)
    batch.add([new_row(0, [1, 2])])
    for chain in [("s",), ("s", "x", "t"), ("t", "s"), ("s", "s", "t"), ()]:
        with pytest.raises(ValueError):
            batch.step(chain, 2)
    batch.release()
    assert all(not e.state_ids() for e in tiny_pool.values())


class _Gate:
    """A worker in another process whose prefill and release wait until every worker has been called."""

    remote = True

    def __init__(self, name: str, barrier, fail: bool = False):
        self.name, self.barrier, self.fail, self.calls = name, barrier, fail, []

    def prefill(self, state_id, rows, predictions=0):
        self.barrier.wait(timeout=10)   # a call made one worker after another never gets through
        self.calls.append("prefill")
        if self.fail:
            raise RuntimeError(f"{self.name}: out of memory")

    def release(self, state_id, row_ids=None):
        self.barrier.wait(timeout=10)
        self.calls.append("release")


def test_prefill_and_release_reach_every_worker_at_once() -> None:
    import threading

    barrier = threading.Barrier(3)
    workers = {n: _Gate(n, barrier) for n in ("s", "m", "t")}
    batch = ChainBatch(workers, "t", CONTEXT)
    batch.add([new_row(0, [1, 2, 3])])
    assert batch.rows["r0"].seen == {"s": 2, "m": 2, "t": 2}
    batch.release()
    assert all(w.calls == ["prefill", "release"] for w in workers.values())
    # one worker failing fails the join, after every worker has answered; the row is not in the batch
    barrier = threading.Barrier(3)
    failing = {n: _Gate(n, barrier, fail=n == "m") for n in ("s", "m", "t")}
    batch = ChainBatch(failing, "t", CONTEXT)
    with pytest.raises(RuntimeError, match="m: out of memory"):
        batch.add([new_row(1, [1, 2])])
    assert not batch.rows and all(w.calls == ["prefill"] for w in failing.values())


def test_engines_in_this_process_are_called_in_turn_on_the_calling_thread(tiny_pool) -> None:
    """In-process engines share this process's cores: calling them from other threads gains nothing and
    starts OpenMP teams that slow this thread's forward passes."""
    import threading

    seen = []
    for engine in tiny_pool.values():
        real = engine.prefill
        engine.prefill = lambda *a, _real=real, **k: (seen.append(threading.current_thread()), _real(*a, **k))[1]
    try:
        batch = ChainBatch(tiny_pool, "t", CONTEXT)
        batch.add([new_row(0, [1, 2, 3])])
        batch.release()
    finally:
        for engine in tiny_pool.values():
            del engine.prefill
    assert seen == [threading.current_thread()] * len(tiny_pool)


def test_prompt_agreement_counts_where_two_models_guess_alike() -> None:
    guesses = {"s": [1, 2, 3, 4], "m": [9, 2, 3, 5], "t": [3, 4]}
    agreement = prompt_agreement(guesses)
    assert agreement[("s", "m")] == agreement[("m", "s")] == (2, 4)
    assert agreement[("s", "t")] == (2, 2) and agreement[("m", "t")] == (1, 2)   # over the last 2 both have
    assert prompt_agreement({"s": [], "t": []}) == {}


def test_rows_carry_their_models_agreement_on_the_prompt(tiny_pool) -> None:
    prompt = [5, 9, 2, 33, 7, 1, 12, 40, 3]
    batch = ChainBatch(tiny_pool, "t", CONTEXT, prompt_positions=6)
    row = new_row(0, prompt)
    batch.add([row])
    guesses = {n: e.prefill("probe", [("p", prompt[:-1])], predictions=6).tokens[0] for n, e in tiny_pool.items()}
    for e in tiny_pool.values():
        e.release("probe")
    assert all(len(g) == 6 for g in guesses.values())
    assert row.prompt_agreement == prompt_agreement(guesses)
    assert set(row.prompt_agreement) == {(a, b) for a in tiny_pool for b in tiny_pool if a != b}
    batch.release()
    plain = ChainBatch(tiny_pool, "t", CONTEXT)
    other = new_row(1, prompt)
    plain.add([other])
    assert other.prompt_agreement == {}
    plain.release()


class _SlowRelease:
    """An engine standing in for a worker in another process, whose release takes a while; it records when
    each of its calls ran."""

    remote = True
    RELEASE_S = 0.05

    def __init__(self, engine):
        self.engine, self.spans = engine, []   # (operation, start, end)

    def _timed(self, name, call, *args, **kwargs):
        import time

        start = time.monotonic()
        try:
            return call(*args, **kwargs)
        finally:
            self.spans.append((name, start, time.monotonic()))

    def prefill(self, *args):
        return self._timed("prefill", self.engine.prefill, *args)

    def draft(self, *args, **kwargs):
        return self._timed("draft", self.engine.draft, *args, **kwargs)

    def verify(self, *args):
        return self._timed("verify", self.engine.verify, *args)

    def release(self, *args):
        import time

        return self._timed("release", lambda *a: (time.sleep(self.RELEASE_S), self.engine.release(*a))[1], *args)


def test_rows_that_finish_are_released_while_the_others_go_on_and_before_their_next_call(tiny_pool) -> None:
    import time

    ps = prompts(4, seed=3)
    max_new = [6, 14, 22, 30]   # four rows leaving at different cycles
    reference = generate(tiny_pool, ("t",), 1, [new_row(i, p, max_new=max_new[i]) for i, p in enumerate(ps)])
    workers = {name: _SlowRelease(engine) for name, engine in tiny_pool.items()}
    batch = ChainBatch(workers, "t", CONTEXT)
    batch.add([new_row(i, p, max_new=max_new[i]) for i, p in enumerate(ps)])
    done, waited = {}, []
    while batch.rows:
        batch.step(("s", "m", "t"), 3)
        finished = [r.row_id for r in batch.rows.values() if r.finish_reason is not None]
        started = time.monotonic()
        for row in batch.remove(finished, wait=False):
            done[row.row_id] = row.generated
        if finished:
            waited.append((bool(batch.rows), time.monotonic() - started))
    assert done == reference
    # while rows stayed, removing the others did not wait for their releases; the last removal did
    assert [stay for stay, _ in waited] == [True] * (len(waited) - 1) + [False]
    assert all(s < _SlowRelease.RELEASE_S for stay, s in waited if stay)
    assert waited[-1][1] >= _SlowRelease.RELEASE_S
    assert all(not e.state_ids() for e in tiny_pool.values()), "a finished batch left worker state behind"
    for worker in workers.values():   # no call reached a worker while a release to it was still on its way
        releases = [(a, b) for op, a, b in worker.spans if op == "release"]
        calls = [(a, b) for op, a, b in worker.spans if op != "release"]
        assert len(releases) == len(waited)
        assert not any(ra < ca < rb or ca < ra < cb for ra, rb in releases for ca, cb in calls)


@pytest.mark.parametrize("chain,window", [(("t",), 1), (("s", "t"), 3), (("s", "m", "t"), 2)])
def test_repetition_penalty_sees_token_zero_beside_holes(tiny_pool, chain, window) -> None:
    """Token 0 in the context must be penalised like any other token, also in a state whose rows have holes
    (a longer row beside it, rejected drafts): equal to transformers' greedy `generate`, alone and batched."""
    params = SamplingParams(repetition_penalty=0.01)   # strong enough that a penalised token 0 is never picked
    target = tiny_pool["t"].forward.model
    rng = random.Random(7)
    for i in range(4):
        prompt = [0] + [rng.randrange(1, 64) for _ in range(rng.randrange(1, 6))]
        longer = [rng.randrange(1, 64) for _ in range(14)]
        ids = torch.tensor([prompt])
        hf = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                             repetition_penalty=0.01, pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
        alone = generate(tiny_pool, chain, window, [new_row(0, prompt, params, 12)])["r0"]
        batched = generate(tiny_pool, chain, window, [new_row(0, prompt, params, 12), new_row(1, longer, params, 12)])
        assert alone == hf
        assert batched["r0"] == hf
