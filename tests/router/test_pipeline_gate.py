"""The pipeline gate: a pipelined batch drafts ahead where that measures faster than lock-step, and only there.

First the gate alone, driven by simulated cycles whose costs follow the pipelined and lock-step cycles of
its docstring; then a real batch over the tiny pool whose drafter and target stand in for workers in
other processes, with calls that take a set time alone and three times that when both work at once (two
processes on the same cores), or the set time whatever the other does (a device each).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from specrouter.contract.calls import SamplingParams, StepResult
from specrouter.router.chain import ChainBatch
from specrouter.router.cycle_report import CycleReport
from specrouter.router.pipelining import PipelineGate
from specrouter.router.row import Row
from tests.router.test_pipelined import CONTEXT, PROMPTS, InAnotherProcess

CHAIN = ("d", "t")
MS = 1_000_000


def simulated_cycle(ahead: bool, from_ahead: bool, whole: bool, draft_ms: float, verify_ms: float,
                    beside_ms: float, ahead_ms: float) -> CycleReport:
    """A cycle's report with the calls' times: the drafter's draft (none when the proposal came from the
    last ahead draft), the target's verification (`beside_ms` while an ahead draft runs) and the ahead
    draft; the target accepts the whole proposal of 3 tokens, or 1 of them."""
    call_ns = {"t": int((beside_ms if ahead else verify_ms) * MS)}
    if not from_ahead:
        call_ns["d"] = int(draft_ms * MS)
    return CycleReport(CHAIN, 3, {}, {"t": [3 if whole else 1]}, {"t": [3]}, {}, call_ns, from_ahead=from_ahead,
                       ahead=StepResult(tokens=[], rows=[]) if ahead else None,
                       ahead_ns=int(ahead_ms * MS) if ahead else 0)


def cycle_ms(ahead: bool, from_ahead: bool, draft_ms: float, verify_ms: float, beside_ms: float,
             ahead_ms: float) -> float:
    """The simulated cycle's wall time: the drafter's draft, then the verification (beside the ahead draft)."""
    return (0.0 if from_ahead else draft_ms) + (max(beside_ms, ahead_ms) if ahead else verify_ms)


def drive(gate: PipelineGate | bool, cycles: int, rng: random.Random, whole: float, taken: float = 1.0,
          **ms: float) -> tuple[list[bool], float]:
    """`cycles` cycles as a batch runs them under `gate` (or always / never pipelined): each accepts its whole
    proposal with probability `whole`, and after one that does, the ahead draft is taken with probability
    `taken`. Returns, per cycle, whether it drafted ahead, and the cycles' simulated wall time."""
    out, last, total = [], False, 0.0
    for _ in range(cycles):
        ahead = gate.wants(CHAIN, 3, 1) if isinstance(gate, PipelineGate) else gate
        from_ahead = last and rng.random() < taken
        accepted = rng.random() < whole
        if isinstance(gate, PipelineGate):
            gate.observe(simulated_cycle(ahead, from_ahead, accepted, **ms), 1, last)
        total += cycle_ms(ahead, from_ahead, **ms)
        out.append(ahead)
        last = ahead and accepted
    return out, total


# a drafter on a device of its own: the verification takes as long beside it
SEPARATE = dict(draft_ms=6.0, verify_ms=12.0, beside_ms=12.3, ahead_ms=8.0)
# shared cores: the verification slows by 8 ms beside the ahead draft
SHARED = dict(draft_ms=6.0, verify_ms=12.0, beside_ms=20.0, ahead_ms=9.0)
# a slow drafter and a fast verifier: the cycle waits for the ahead draft, longer than the drafting it saves
SLOW_AHEAD = dict(draft_ms=15.0, verify_ms=5.0, beside_ms=5.0, ahead_ms=25.0)
# the ahead draft adds 3 ms to the verification: it pays where more than half the cycles accept everything
BETWEEN = dict(draft_ms=6.0, verify_ms=12.0, beside_ms=15.0, ahead_ms=8.0)


@pytest.mark.parametrize("costs, whole, taken, pipelines", [
    (SEPARATE, 0.6, 1.0, True), (SEPARATE, 0.8, 0.8, True), (SHARED, 0.2, 1.0, False), (SHARED, 1.0, 1.0, False),
    (SEPARATE, 0.0, 1.0, False), (SEPARATE, 0.6, 0.0, False), (SLOW_AHEAD, 0.5, 1.0, False)])
def test_the_gate_runs_the_mode_its_measures_price_cheaper(costs, whole, taken, pipelines) -> None:
    """After its trials, every cycle runs the cheaper mode, but for a trial of the other every recheck. (A
    slow average here, so that its shares are within 0.15 of the truth at about four standard deviations.)"""
    gate = PipelineGate(trial_cycles=4, recheck_cycles=100, alpha=0.02)
    modes, _ = drive(gate, 600, random.Random(0), whole, taken, **costs)
    settled = modes[8:]
    share = sum(settled) / len(settled)
    # rechecks: a trial of `trial_cycles` per `recheck_cycles` cycles or more, so at most 4 in 100 run the other
    assert share >= 0.95 if pipelines else share <= 0.05, share
    (summary,) = gate.summary().values()
    assert summary["pipelined"] == float(pipelines)
    assert summary["whole"] == pytest.approx(whole, abs=0.15)
    if pipelines:   # measured after every cycle that accepted everything (in lock-step only in the trials)
        assert summary["taken"] == pytest.approx(taken, abs=0.15)


def test_the_gate_follows_the_cores_when_they_change() -> None:
    """Pipelined while the drafter has compute of its own; once the verification slows beside it (another
    load took the cores), lock-step within a few cycles; and pipelined again after the next trial once the
    cores are free. The prices lie more than 20% apart here, so a trial of the mode not run comes every
    4 x 50 cycles and lasts 4."""
    gate, rng = PipelineGate(trial_cycles=4, recheck_cycles=50), random.Random(1)
    assert sum(drive(gate, 400, rng, 0.6, **SEPARATE)[0][-100:]) >= 96
    shared, _ = drive(gate, 400, rng, 0.6, **SHARED)
    assert sum(shared[:12]) <= 8 and sum(shared[-100:]) <= 4
    assert sum(drive(gate, 400, rng, 0.6, **SEPARATE)[0][-100:]) >= 96


def test_the_gate_follows_the_text_from_request_to_request() -> None:
    """Requests of tables (two cycles in three accept everything) and of code (one in six) take turns, 32
    cycles each, where the ahead draft pays only for the tables: the gate pipelines most of the tables'
    cycles and few of the code's, with no trial needed to see the text change, and its cycles take less time
    in all than those of either mode alone."""
    texts = [0.67, 0.17] * 20
    totals = {}
    for name, mode in (("gate", PipelineGate()), ("always", True), ("never", False)):
        rng, total, shares = random.Random(3), 0.0, {0.67: [], 0.17: []}
        for whole in texts:
            modes, ms = drive(mode, 32, rng, whole, **BETWEEN)
            shares[whole].append(sum(modes) / len(modes))
            total += ms
        totals[name] = total
        if name == "gate":
            tables, code = (sum(v[2:]) / len(v[2:]) for v in shares.values())
            assert tables >= 0.6 and code <= 0.3, (tables, code)
    assert totals["gate"] < min(totals["always"], totals["never"]), totals


def test_each_chain_window_and_batch_size_is_priced_on_its_own() -> None:
    gate, rng = PipelineGate(trial_cycles=4, recheck_cycles=100), random.Random(2)
    drive(gate, 200, rng, 0.6, **SEPARATE)
    assert gate.wants(CHAIN, 3, 1)
    assert not gate.wants(CHAIN, 4, 1)       # a window never measured starts with a lock-step trial
    assert not gate.wants(CHAIN, 3, 5)       # so does a batch of another size (5 to 8 rows share a key)
    assert not gate.wants(("t",), 0, 1)      # the target alone drafts nothing ahead
    assert len(gate.measures) == 3


def test_the_gate_refuses_trials_too_short_to_measure_a_take() -> None:
    with pytest.raises(ValueError, match="trial_cycles must be >= 2"):
        PipelineGate(trial_cycles=1)


# -- a real batch, its levels standing in for worker processes --------------------------------------------------


class Cores:
    """The compute the stand-in workers share: a call is `ms` of work, done at full speed while it runs
    alone and at 1/`slowdown` of it while another call runs too."""

    def __init__(self, slowdown: float):
        self.slowdown, self.busy, self._lock = slowdown, 0, threading.Lock()

    def work(self, ms: float) -> None:
        with self._lock:
            self.busy += 1
        try:
            left = ms / 1e3
            while left > 0:
                time.sleep(0.0005)
                left -= 0.0005 / (self.slowdown if self.busy > 1 else 1.0)
        finally:
            with self._lock:
                self.busy -= 1


class OnCores(InAnotherProcess):
    """A worker in another process whose draft and verify calls take `ms` of work on `cores`."""

    def __init__(self, engine, cores: Cores, ms: float):
        super().__init__(engine)
        self.cores, self.ms = cores, ms

    def draft(self, state_id, level, window, rows, hand_up=True):
        self.cores.work(self.ms)
        return super().draft(state_id, level, window, rows, hand_up)

    def verify(self, state_id, level, rows, hand_up):
        self.cores.work(self.ms)
        return super().verify(state_id, level, rows, hand_up)


@pytest.mark.parametrize("slowdown, pipelines", [(1.0, True), (3.0, False)])
def test_a_batch_pipelines_where_its_workers_overlap_and_not_where_they_share_cores(tiny_pool, twin, slowdown,
                                                                                   pipelines) -> None:
    """The twin drafter guesses every token, so an ahead draft is always taken and saves the drafter's 10 ms;
    where the two calls share the cores three to one, the verification beside it takes 30 ms instead of 10,
    more than it saves. The output is the target's either way."""
    cores = Cores(slowdown)
    workers = {"d": OnCores(twin, cores, 10.0), "t": OnCores(tiny_pool["t"], cores, 10.0)}
    gate = PipelineGate(trial_cycles=4, recheck_cycles=200)
    batch = ChainBatch(workers, "t", CONTEXT, pipelined=gate)
    rows = [Row(f"r{i}", p, len(p), SamplingParams(), 120) for i, p in enumerate(PROMPTS)]
    reference = ChainBatch({"t": tiny_pool["t"]}, "t", CONTEXT)
    expected = [Row(f"r{i}", p, len(p), SamplingParams(), 120) for i, p in enumerate(PROMPTS)]
    reference.add(expected)
    batch.add(rows)
    ahead = []
    try:
        while any(r.finish_reason is None for r in expected):
            reference.step(("t",), 0)
        for _ in range(30):
            ahead.append(batch.step(CHAIN, 2).ahead is not None)
    finally:
        batch.release()
        reference.release()
    for r, e in zip(rows, expected):
        assert r.generated == e.generated[:len(r.generated)]
    settled = ahead[8:]
    assert all(settled) if pipelines else not any(settled), (ahead, gate.summary())
