"""A cycle observer for tests: what each cycle of a batcher ran."""

from __future__ import annotations

from specrouter.router.chain import ChainBatch
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.cycle_observers import CycleObserver


class RecordedCycles(CycleObserver):
    """Each cycle done, in order: its report and the rows that ran it (appended on the loop's thread)."""

    def __init__(self):
        self.cycles: list[tuple[CycleReport, list[Row]]] = []

    def cycle_done(self, batch: ChainBatch, report: CycleReport, rows: list[Row], cycle_ns: int,
                   chosen: bool) -> None:
        self.cycles.append((report, list(rows)))

    def sizes(self) -> list[int]:
        """The rows of each cycle."""
        return [len(rows) for _, rows in self.cycles]
