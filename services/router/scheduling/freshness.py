"""When each pair was last measured, by this router's cycles or (through the profiler's counts) any
router's: what exploration reads to find the pairs overdue for a cycle."""

from __future__ import annotations

import math
from collections.abc import Sequence

from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.scheduling.candidates import Pair, chain_pairs, mode_of
from specrouter.router.scheduling.snapshot import Snapshot


class PairFreshness:
    def __init__(self) -> None:
        self._seen_at: dict[Pair, float] = {}
        self._checks: dict[Pair, int] = {}   # checks at position 0 in the latest snapshot that grew them

    def note_snapshot(self, snapshot: Snapshot, now: float) -> None:
        """A pair whose checks grew since the last snapshot was measured (by any router)."""
        for a in snapshot.acceptance:
            if a.position != 0:
                continue
            pair = (a.drafter, a.verifier, a.mode)
            if a.proposed_total > self._checks.get(pair, 0):
                self._checks[pair] = a.proposed_total
                self._seen_at[pair] = max(self._seen_at.get(pair, -math.inf), now)

    def observe(self, report: CycleReport, rows: Sequence[Row], now: float) -> None:
        """The pairs of the cycle's chain, in the modes of its rows, were measured now; so were the lookup's
        pairs its rows were judged for without running it (`CycleReport.shadow`)."""
        modes = {mode_of(r) for r in rows}
        for d, v in chain_pairs(report.chain):
            for mode in modes:
                self._seen_at[(d, v, mode)] = now
        for (d, v), judged in report.shadow.items():
            for r, judgement in zip(rows, judged):
                if judgement is not None:
                    self._seen_at[(d, v, mode_of(r))] = now

    def mark(self, pair: Pair, now: float) -> None:
        """The pair was asked for (an exploration cycle), so that it is not asked for again before the
        snapshot confirms it."""
        self._seen_at[pair] = now

    def value(self, pair: Pair) -> float:
        """When the pair was last measured (-inf: never)."""
        return self._seen_at.get(pair, -math.inf)
