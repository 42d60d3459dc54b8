"""The fakes the scheduler's tests share: a clock, a batch, a snapshot of a known pool, and a scheduler on it."""

from __future__ import annotations

from specrouter.router.row import Row
from specrouter.router.measurements import snapshot_from_pb
from specrouter.router.scheduling.scheduler import Scheduler
from specrouter.router.scheduling.settings import SchedulerSettings
from specrouter.v1 import profiler_pb2 as ppb
from specrouter.contract.calls import SamplingParams

GREEDY = ppb.DECODING_MODE_GREEDY
MS = 1e6
DECODE_MS = {"a": 1.0, "b": 2.5, "t": 10.0}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBatch:
    """What the scheduler reads of a ChainBatch: its rows."""

    def __init__(self, rows: int, greedy: bool = True):
        params = SamplingParams() if greedy else SamplingParams(temperature=1.0, seed=1)
        self.rows = {str(i): Row(str(i), [1, 2, 3], 3, params, 64) for i in range(rows)}
        for r in self.rows.values():
            r.seen = {m: 2 for m in DECODE_MS}


def snapshot_pb(acceptance: dict[tuple[str, str], float], checks: int = 10_000, depth: int = 9,
                samples: int = 100) -> ppb.SnapshotResponse:
    s = ppb.SnapshotResponse(ema_alpha=0.1, acceptance_alpha=0.01)
    for model, ms in DECODE_MS.items():
        for b in (1, 2, 3, 4, 8, 16):
            for k in range(1, 11):
                s.forward.add(model=model, batch_size_bucket=b, tokens_per_row_bucket=k,
                              ema_forward_ns=ms * MS * (1 + 0.02 * b * k), samples=10)
    for (d, v), rate in acceptance.items():
        for position in range(depth):
            s.acceptance.add(drafter=d, verifier=v, mode=GREEDY, position=position, ema_acceptance_rate=rate,
                             accepted_total=int(rate * checks), proposed_total=checks, samples=samples)
    return s


def snapshot(acceptance: dict[tuple[str, str], float], **kwargs):
    """The profiler's reply as the scheduler reads it (decoded at the router's edge)."""
    return snapshot_from_pb(snapshot_pb(acceptance, **kwargs))


def make(acceptance, clock=None, **settings) -> tuple[Scheduler, dict]:
    holder = {"snapshot": snapshot(acceptance)}
    sched = Scheduler(list(DECODE_MS), "t", SchedulerSettings(**settings), lambda: holder["snapshot"],
                      clock=clock or Clock())
    return sched, holder
