"""A pipelined batch: the drafter drafts ahead while the levels above verify, and the output stays the target's.

Drafters stand in for workers in other processes (their calls run on the batch's fan-out threads, beside
the verifiers): the tiny pool's own drafter; a twin of the target, which guesses every token right, so
that every cycle after the first can take its proposal from the ahead draft; the same twin, slow; a
drafter that is always wrong; and one that is lost in the middle of a request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import threading
import time

import pytest
import torch
from pydantic import ValidationError

from specrouter.client import Client
from specrouter.contract.calls import SamplingParams, StepResult
from specrouter.inprocess import InProcessPool
from specrouter.launcher import LocalCluster
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.router.batcher import Batcher
from specrouter.router.chain import AHEAD_STREAM_LEVEL, ChainBatch
from specrouter.router.cycle_report import CycleReport
from specrouter.router.handles import Finished
from specrouter.router.requests import GenerationRequest
from specrouter.router.row import Row
from specrouter.router.settings import RouterSettings
from specrouter.worker.engine import WorkerEngine
from specrouter.worker.forward import ModelForward
from tests.conftest import DEMO_POOL, TINY_SHAPES, TINY_VOCAB, tiny_engines, tiny_llama
from tests.router.test_row_isolation import outcome
from tests.router.test_worker_failover import Prefer
from tests.stats import chi_square_p_value, exact_joint

CONTEXT = 256
TARGET_SHAPE = TINY_SHAPES["t"]
PROMPTS = [[5, 9, 3, 17, 2], [7, 1, 40, 22], [11, 3, 3, 3, 8, 60, 1, 2, 9], [33]]
MAX_NEW = [24, 13, 30, 19]
JOINS_AFTER = 2   # cycles before the last prompt's row joins the batch
SERVED_DRAFTER, SERVED_MIDDLE, SERVED_TARGET = "stdlib-1m", "stdlib-5m", "stdlib-29m"   # the demo pool


class InAnotherProcess:
    """An engine standing in for a worker in another process: its calls may overlap the other levels'. It
    counts its calls by kind and level, and can be slow, or go away after some draft calls."""

    remote = True

    def __init__(self, engine: WorkerEngine, delay_s: float = 0.0, drafts_before_lost: int | None = None):
        self.engine, self.delay_s, self.drafts_before_lost = engine, delay_s, drafts_before_lost
        self.name, self.info, self.address = engine.name, engine.info, f"stand-in:{engine.name}"
        self.drafts: list[int] = []   # the level of each draft call
        self.in_flight, self._lock = 0, threading.Lock()

    @contextlib.contextmanager
    def _call(self):
        with self._lock:
            self.in_flight += 1
        try:
            time.sleep(self.delay_s)
            yield
        finally:
            with self._lock:
                self.in_flight -= 1

    def prefill(self, state_id, rows, predictions=0):
        with self._call():
            return self.engine.prefill(state_id, rows, predictions)

    def draft(self, state_id, level, window, rows, hand_up=True):
        with self._call():
            self.drafts.append(level)
            if self.drafts_before_lost is not None and len(self.drafts) > self.drafts_before_lost:
                raise ConnectionError(f"{self.name} is gone")
            return self.engine.draft(state_id, level, window, rows, hand_up)

    def verify(self, state_id, level, rows, hand_up):
        with self._call():
            return self.engine.verify(state_id, level, rows, hand_up)

    def release(self, state_id, row_ids=None):
        with self._call():
            return self.engine.release(state_id, row_ids)

    def probe(self, timeout_s=2.0):
        if self.drafts_before_lost is not None and len(self.drafts) > self.drafts_before_lost:
            raise ConnectionError(f"{self.name} does not answer")

    def close(self):
        pass


class AlwaysWrong:
    """A drafter without a model in another process whose every guess is wrong: it keeps each row's cache as
    a worker would (rollback, then the pending tokens, then all but the last drafted token) and proposes, at
    each position, a token the target never picks there (one more than the target's own pick)."""

    remote = True

    def __init__(self, target: WorkerEngine):
        self.name, self.info, self.address, self.target = "wrong", target.info, "stand-in:wrong", target
        self.cache: dict[str, dict[str, list[int]]] = {}

    def prefill(self, state_id, rows, predictions=0):
        held = self.cache.setdefault(state_id, {})
        for row_id, tokens in rows:
            held[row_id] = list(tokens)
        return StepResult(tokens=[[] for _ in rows], rows=[None] * len(rows))

    def draft(self, state_id, level, window, rows, hand_up=True):
        out = []
        for r in rows:
            held = self.cache[state_id][r.row_id]
            del held[len(held) - r.rollback:]
            held.extend(r.pending)
            out.append([(t + 1) % TINY_VOCAB for t in greedy_continuation(self.target, held, window)])
            held.extend(out[-1][:-1])
        return StepResult(tokens=out, rows=[None] * len(rows))

    def release(self, state_id, row_ids=None):
        held = self.cache.get(state_id, {})
        for row_id in list(held) if row_ids is None else row_ids:
            held.pop(row_id, None)

    def probe(self, timeout_s=2.0):
        pass

    def close(self):
        pass


def greedy_continuation(target: WorkerEngine, tokens: list[int], n: int) -> list[int]:
    """The target's next `n` greedy tokens after `tokens` (a throwaway state of its own)."""
    rows = [Row("probe", list(tokens), len(tokens), SamplingParams(), n)]
    batch = ChainBatch({target.name: target}, target.name, CONTEXT)
    batch.add(rows)
    try:
        while rows[0].finish_reason is None:
            batch.step((target.name,), 0)
    finally:
        batch.release()
    return rows[0].generated


def drafter_of(kind: str, tiny_pool, twin) -> InAnotherProcess | AlwaysWrong:
    if kind == "wrong":
        return AlwaysWrong(tiny_pool["t"])
    return InAnotherProcess({"tiny": tiny_pool["s"], "twin": twin, "slow": twin}[kind],
                            delay_s=0.02 if kind == "slow" else 0.0)


def run_joining(workers, chain, window, params=None, pipelined=True) -> tuple[dict[str, list[int]], list[CycleReport]]:
    """Every prompt's row to its end on `chain`, the last joining after JOINS_AFTER cycles, finished rows
    leaving after each cycle: each row's generated tokens, and the cycles' reports."""
    params = params or [SamplingParams()] * len(PROMPTS)
    rows = [Row(f"r{i}", p, len(p), sp, n) for i, (p, sp, n) in enumerate(zip(PROMPTS, params, MAX_NEW))]
    batch = ChainBatch(workers, "t", CONTEXT, pipelined=pipelined)
    batch.add(rows[:-1])
    reports, done = [], {}
    try:
        while batch.rows:
            reports.append(batch.step(chain, window))
            assert all(getattr(w, "in_flight", 0) == 0 for w in workers.values()), "a call outlived its cycle"
            if len(reports) == JOINS_AFTER:
                batch.add(rows[-1:])
            for row in batch.remove([r.row_id for r in batch.rows.values() if r.finish_reason is not None]):
                done[row.row_id] = row.generated
    finally:
        batch.release()
    return done, reports


@pytest.fixture(scope="module")
def reference(tiny_pool) -> dict[str, list[int]]:
    return run_joining({"t": tiny_pool["t"]}, ("t",), 0, pipelined=False)[0]


@pytest.mark.parametrize("kind", ["tiny", "twin", "slow", "wrong"])
@pytest.mark.parametrize("levels", [2, 3])
@pytest.mark.parametrize("window", [1, 2, 4, 8])
def test_pipelined_chains_emit_the_targets_greedy_tokens(tiny_pool, twin, reference, kind, levels, window) -> None:
    drafter = drafter_of(kind, tiny_pool, twin)
    chain = ("d", "t") if levels == 2 else ("d", "m", "t")
    workers = {"d": drafter, "m": tiny_pool["m"], "t": tiny_pool["t"]}
    outputs, reports = run_joining({m: workers[m] for m in chain}, chain, window)
    assert outputs == reference
    assert all(r.ahead is not None for r in reports)   # every cycle drafts ahead beside the verifiers
    if kind == "wrong":   # nothing it guesses is ever emitted, so no cycle takes its proposal from an ahead draft
        assert not any(r.from_ahead for r in reports)
    if kind == "tiny":
        assert set(drafter.drafts) == {0, AHEAD_STREAM_LEVEL}


@pytest.mark.parametrize("window", [1, 3, 6])
def test_a_drafter_that_guesses_right_drafts_only_when_rows_join(tiny_pool, twin, reference, window) -> None:
    """With every guess right, every cycle accepts its whole proposal, and only the first cycle and the one
    after a row joins call the drafter to draft: the others verify what the ahead draft left. A proposal
    built from a cache the router got wrong would show as a rejection here."""
    drafter = InAnotherProcess(twin)
    outputs, reports = run_joining({"d": drafter, "t": tiny_pool["t"]}, ("d", "t"), window)
    assert outputs == reference
    for r in reports:
        assert r.accepted["t"] == r.proposed["t"], (r.accepted, r.proposed)
    fresh = [i for i, r in enumerate(reports) if not r.from_ahead]
    assert fresh == [0, JOINS_AFTER]
    assert drafter.drafts.count(0) == 2 and drafter.drafts.count(AHEAD_STREAM_LEVEL) == len(reports)


def test_a_three_level_chain_takes_the_ahead_draft_when_both_levels_accept_it(tiny_pool, twin, reference) -> None:
    """Twin drafter and twin intermediate: each level accepts everything and adds a token, so the ahead
    draft of W + 2 tokens leaves the next cycle a whole window."""
    second = WorkerEngine("m2", ModelForward(tiny_llama(*TARGET_SHAPE)))
    workers = {"d": InAnotherProcess(twin), "m2": second, "t": tiny_pool["t"]}
    outputs, reports = run_joining(workers, ("d", "m2", "t"), 3)
    assert outputs == reference
    assert [i for i, r in enumerate(reports) if not r.from_ahead] == [0, JOINS_AFTER]


@pytest.mark.parametrize("kind", ["tiny", "twin"])
def test_coupled_rows_pipeline_and_keep_their_seeded_tokens(tiny_pool, twin, kind) -> None:
    """Coupled sampling checks every proposal by equality with the level's own seeded pick, so a pipelined
    chain emits the target-only chain's tokens for the same seeds."""
    params = [SamplingParams(temperature=0.9, seed=100 + i, coupled=True) for i in range(len(PROMPTS))]
    expected = run_joining({"t": tiny_pool["t"]}, ("t",), 0, params, pipelined=False)[0]
    workers = {"d": drafter_of(kind, tiny_pool, twin), "t": tiny_pool["t"]}
    outputs, reports = run_joining(workers, ("d", "t"), 3, params)
    assert outputs == expected
    assert all(r.ahead is not None for r in reports)
    if kind == "twin":
        assert sum(r.from_ahead for r in reports) >= len(reports) // 2


def test_sampled_rows_draft_ahead_too(tiny_pool) -> None:
    """Speculatively sampled rows, joining and leaving, draft ahead as well, and every row ends with the
    tokens it asked for (their distribution: the chi-square tests below)."""
    params = [SamplingParams(temperature=0.9, seed=7 + i) for i in range(len(PROMPTS))]
    workers = {"d": InAnotherProcess(tiny_pool["s"]), "t": tiny_pool["t"]}
    outputs, reports = run_joining(workers, ("d", "t"), 3, params)
    assert [len(outputs[f"r{i}"]) for i in range(len(PROMPTS))] == MAX_NEW
    assert all(r.ahead is not None and r.ahead.rows[0] is not None for r in reports)


def test_no_ahead_draft_for_a_drafter_in_this_process(tiny_pool, reference) -> None:
    """In this process the drafter could only run after the verifiers, never beside them."""
    outputs, reports = run_joining({"s": tiny_pool["s"], "t": tiny_pool["t"]}, ("s", "t"), 3)
    assert outputs == reference
    assert not any(r.ahead is not None for r in reports)


def test_removing_a_row_mid_pipeline_frees_it_on_every_worker(tiny_pool, twin) -> None:
    drafter = InAnotherProcess(twin)
    workers = {"d": drafter, "t": tiny_pool["t"]}
    rows = [Row(f"r{i}", p, len(p), SamplingParams(), 40) for i, p in enumerate(PROMPTS)]
    batch = ChainBatch(workers, "t", CONTEXT, pipelined=True)
    batch.add(rows)
    for _ in range(3):
        assert batch.step(("d", "t"), 4).ahead is not None
    batch.remove(["r1"])   # as a cancelled request leaves its batch
    state = batch.state_ids["d"]
    for engine in (twin, tiny_pool["t"]):
        assert "r1" not in engine.state(state).row_ids
    assert batch.step(("d", "t"), 4).from_ahead   # the rows that stay keep their ahead drafts
    batch.release()
    assert state not in twin.state_ids() and state not in tiny_pool["t"].state_ids()


def test_a_drafter_lost_mid_request_leaves_the_output_exact(tiny_pool, twin, reference) -> None:
    """The drafter goes away after five draft calls, an ahead draft among them: the batch rebuilds its state
    once, finds it gone, and goes on without it, through the batcher as a router runs it."""
    drafter = InAnotherProcess(twin, drafts_before_lost=5)
    pool = {"d": drafter, "t": tiny_pool["t"]}
    batcher = Batcher(pool, "t", CONTEXT, None, chooser=Prefer(("d", "t"), ("t",)), pipelined=True)
    batcher.start()
    try:
        done = outcome(batcher.submit(GenerationRequest(PROMPTS[0], SamplingParams(), MAX_NEW[0])))
    finally:
        batcher.stop()
    assert isinstance(done, Finished), done
    assert done.token_ids == reference["r0"]
    assert done.stats["chain_counts"]["d,t"] >= 3 and done.stats["chain_counts"]["t"] > 0
    assert "d" in batcher.health.down()
    for state in tiny_pool["t"].state_ids():
        tiny_pool["t"].release(state)


def test_settings_refuse_pipelining_the_models_in_the_router(tmp_path) -> None:
    for mode in (True, "auto", "always"):
        with pytest.raises(ValidationError, match="drop --pipelined .*or models_in_process"):
            RouterSettings(tokenizer_dir=tmp_path, models_in_process=True, pool_dir=tmp_path, pipelined=mode)
    modes = {given: RouterSettings(tokenizer_dir=tmp_path, workers=["h:1"], pipelined=given).pipelined
             for given in (True, "true", False, "false", "auto", "Always", "off")}
    assert modes == {True: "auto", "true": "auto", False: "off", "false": "off", "auto": "auto", "Always": "always",
                     "off": "off"}
    with pytest.raises(ValidationError, match="pipelined"):
        RouterSettings(tokenizer_dir=tmp_path, workers=["h:1"], pipelined="sometimes")


@pytest.fixture(scope="module")
def pipelined_cluster(tmp_path_factory):
    cluster = LocalCluster(DEMO_POOL, tmp_path_factory.mktemp("logs"), router_args=["--pipelined", "always"],
                           gateway_port=None)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_pipelined_cluster_emits_the_targets_tokens_through_its_workers(pipelined_cluster) -> None:
    """Through the services, each level a worker process of its own: greedy requests on two- and three-level
    chains and auto, and seeded (coupled) requests, give the target-only tokens; the breakdown counts the
    ahead drafts and the cycles that took their proposal from one."""
    pool = InProcessPool.open(DEMO_POOL)
    prompts = heldout_code_prompts(3)
    expected = [g.token_ids for g in pool.generate(prompts, [SERVED_TARGET], 0, SamplingParams(), 24)]
    with Client(pipelined_cluster.router.address) as client:
        for chain, window in [(SERVED_TARGET, 0), (f"{SERVED_DRAFTER},{SERVED_TARGET}", 3),
                              (f"{SERVED_DRAFTER},{SERVED_MIDDLE},{SERVED_TARGET}", 2), ("auto", 0)]:
            got = [client.generate(p, max_new_tokens=24, chain=chain, window=window) for p in prompts]
            assert [g.token_ids for g in got] == expected, chain
            if chain.startswith(SERVED_DRAFTER):
                ahead = [g.stats.breakdown.ahead.calls for g in got]
                assert ahead == [g.stats.cycles for g in got]
                assert sum(g.stats.breakdown.cycles_from_ahead for g in got) > 0
                assert all(g.stats.breakdown.ahead.forward_ns > 0 for g in got)
        seeded = {chain: client.generate(prompts[0], max_new_tokens=24, temperature=0.8, seed=5, chain=chain,
                                         window=3).token_ids
                  for chain in (SERVED_TARGET, f"{SERVED_DRAFTER},{SERVED_TARGET}")}
    assert len({tuple(t) for t in seeded.values()}) == 1, seeded


def test_a_stop_string_ends_a_pipelined_chain_where_it_ends_target_only(pipelined_cluster) -> None:
    """A stop string the target's output reaches mid-way (a piece of its own text): the pipelined chains end
    'stop' on the tokens and text target-only ends on, though their ahead drafts ran past it."""
    pool = InProcessPool.open(DEMO_POOL)
    prompts = heldout_code_prompts(6)
    free = pool.generate(prompts, [SERVED_TARGET], 0, SamplingParams(), 24)
    checked = 0
    with Client(pipelined_cluster.router.address) as client:
        for prompt, g in zip(prompts, free):
            stop = g.text[len(g.text) // 2:][:3]
            if len(g.token_ids) < 8 or not stop.strip() or checked == 3:
                continue
            alone = client.generate(prompt, max_new_tokens=24, stop=[stop], chain=SERVED_TARGET)
            assert alone.finish_reason == "stop" and len(alone.token_ids) < len(g.token_ids)
            for chain, window in [(f"{SERVED_DRAFTER},{SERVED_TARGET}", 3),
                                  (f"{SERVED_DRAFTER},{SERVED_MIDDLE},{SERVED_TARGET}", 2)]:
                got = client.generate(prompt, max_new_tokens=24, stop=[stop], chain=chain, window=window)
                assert (got.finish_reason, got.token_ids, got.text) == (alone.finish_reason, alone.token_ids,
                                                                        alone.text), (chain, stop)
                assert got.stats.breakdown.ahead.calls > 0
            checked += 1
    assert checked >= 2, "too few outputs with text to stop at; pick other prompts"


def test_a_router_that_pipelines_where_it_pays_emits_the_targets_tokens(pipelined_cluster, tmp_path) -> None:
    """`--pipelined auto` over the same workers: the gate decides cycle by cycle, the tokens stay the target's,
    and its trials run ahead drafts (the first cycles of a chain try both modes)."""
    router = pipelined_cluster.another_router(tmp_path, ["--pipelined", "auto"], "router-auto")
    pool = InProcessPool.open(DEMO_POOL)
    prompts = heldout_code_prompts(3)
    expected = [g.token_ids for g in pool.generate(prompts, [SERVED_TARGET], 0, SamplingParams(), 24)]
    with Client(router.address) as client:
        got = [client.generate(p, max_new_tokens=24, chain=f"{SERVED_DRAFTER},{SERVED_TARGET}", window=3)
               for p in prompts]
    assert [g.token_ids for g in got] == expected
    ahead = sum(g.stats.breakdown.ahead.calls for g in got)
    assert 0 < ahead <= sum(g.stats.cycles for g in got)


@pytest.mark.parametrize("flags, says", [(["--models-in-router", "--pipelined", "auto"], "drop one of them"),
                                         (["--pipelined", "sometimes"], "takes off, auto or always")])
def test_up_refuses_pipelining_it_cannot_do(tmp_path, flags, says) -> None:
    done = subprocess.run([sys.executable, "-m", "specrouter.cli", "up", "--port", "0", "--log-dir", str(tmp_path),
                           *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "INVALID_ARGUMENT" in done.stderr and says in done.stderr
    assert not list(tmp_path.iterdir())   # refused before any service started


# -- sampled rows keep the target's distribution ---------------------------------------------------------------

SAMPLED_VOCAB, SAMPLED_PROMPT, SAMPLED_TOKENS, SAMPLES = 4, [1, 2, 3], 3, 2000
P_THRESHOLD = 1e-4   # each chi-square assertion's false-positive rate


@pytest.fixture(scope="module")
def peaked():
    return tiny_engines(vocab=SAMPLED_VOCAB, sharpness=16.0)   # peaked, disagreeing distributions


@pytest.fixture(scope="module")
def peaked_twin() -> WorkerEngine:
    """A copy of the peaked pool's target: its guesses are right as often as the target's own picks agree
    with themselves, so most second cycles take the ahead draft's proposal."""
    return WorkerEngine("twin", ModelForward(tiny_llama(*TARGET_SHAPE, vocab=SAMPLED_VOCAB, sharpness=16.0)))


class WrongAheadRows(ChainBatch):
    """A deliberately broken pipeline: the ahead draft's proposals travel with rows that are not the
    distribution they were drawn from (uniform ones)."""

    def _next_ahead(self, chain, window, rows, emitted, cached, ahead):
        uniform = [None if q is None else torch.full_like(q, 1.0 / q.shape[-1]) for q in ahead.rows]
        return super()._next_ahead(chain, window, rows, emitted, cached, StepResult(tokens=ahead.tokens, rows=uniform))


def sample_pipelined(engines, drafter: WorkerEngine, params: SamplingParams, batch_class=ChainBatch,
                     ) -> tuple[torch.Tensor, int]:
    """Counts [V, V, V] of the three new tokens of SAMPLES requests, one seed each, one at a time through a
    pipelined drafter -> t chain at window 1 (the second cycle takes the ahead draft's proposal whenever the
    first accepted the drafter's token and t's own token is the drafter's next guess); and how many cycles
    took one."""
    workers = {"s": InAnotherProcess(drafter), "t": engines["t"]}
    counts, taken = torch.zeros(SAMPLED_VOCAB, SAMPLED_VOCAB, SAMPLED_VOCAB), 0
    for seed in range(SAMPLES):
        row = Row("r", list(SAMPLED_PROMPT), len(SAMPLED_PROMPT), dataclasses.replace(params, seed=seed), SAMPLED_TOKENS)
        batch = batch_class(workers, "t", CONTEXT, pipelined=True)
        batch.add([row])
        while row.finish_reason is None:
            taken += batch.step(("s", "t"), 1).from_ahead
        batch.release()
        counts[tuple(row.generated)] += 1
    return counts, taken


@pytest.mark.slow   # SAMPLES requests one at a time
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.2)],
                         ids=["plain", "processors"])
def test_sampled_rows_through_a_pipelined_chain_keep_the_targets_distribution(peaked, peaked_twin, params) -> None:
    """With a twin of the target drafting, most second cycles take the ahead draft's proposal (a smaller
    drafter disagrees too often with these peaked distributions for that)."""
    expected = exact_joint(peaked["t"].forward.model, params, SAMPLED_PROMPT, SAMPLED_TOKENS)
    counts, taken = sample_pipelined(peaked, peaked_twin, params)
    assert taken > SAMPLES // 3   # the ahead draft's proposals were checked, not only the lock-step path
    assert chi_square_p_value(counts, expected) > P_THRESHOLD


@pytest.mark.slow
def test_the_same_test_fails_for_proposals_with_the_wrong_rows(peaked, peaked_twin) -> None:
    """Power control: ahead proposals checked against rows other than those they were drawn from. (Rows
    left out altogether would not do: a proposal checked as a point mass keeps the target's distribution
    whatever it was drawn from, as the lookup's do.)"""
    params = SamplingParams(temperature=1.0)
    counts, _ = sample_pipelined(peaked, peaked_twin, params, WrongAheadRows)
    assert chi_square_p_value(counts, exact_joint(peaked["t"].forward.model, params, SAMPLED_PROMPT, SAMPLED_TOKENS)) < P_THRESHOLD
