"""The scheduler's ledger: per (chain, window, batch size, scheduled or not), the cycles' measured and
predicted figures, cumulative, for the report (which diffs two reads to get a run's)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.scheduling.candidates import Pair, chain_pairs, mode_of
from specrouter.router.scheduling.cycle_cost import Prediction


@dataclass
class Tally:
    """Drafts checked against a prediction: realized accepted tokens and positions checked (up to and
    including the first rejection), and what the prediction expected of both."""

    accepted: float = 0.0
    checked: float = 0.0
    predicted_accepted: float = 0.0
    predicted_checked: float = 0.0

    def decay(self, keep: float) -> None:
        """Every figure times `keep`: older cycles weigh less."""
        self.accepted *= keep
        self.checked *= keep
        self.predicted_accepted *= keep
        self.predicted_checked *= keep


def checks(report: CycleReport, verifier: str, row_index: int) -> tuple[int, int]:
    """(accepted, positions checked) of one row at the level of `verifier` in the cycle."""
    return report.accepted[verifier][row_index], report.checked(verifier, row_index)


@dataclass
class Ledger:
    """Cumulative measured and predicted figures of one (chain, window, batch size, scheduled or not)."""

    cycles: int = 0
    cycle_ns: int = 0
    emitted: float = 0.0                 # mean tokens emitted per row, summed over cycles
    predicted_cycle_ns: float = 0.0
    predicted_emitted: float = 0.0
    pairs: dict[Pair, Tally] = field(default_factory=lambda: defaultdict(Tally))


class LedgerKey(NamedTuple):
    """Which cycles a ledger adds up."""

    chain: tuple[str, ...]
    window: int        # 0 for the target alone
    batch_size: int
    adaptive: bool     # chosen by the scheduler, or named by the requests


class Ledgers:
    def __init__(self) -> None:
        self._by_key: dict[LedgerKey, Ledger] = defaultdict(Ledger)

    def observe(self, report: CycleReport, rows: Sequence[Row], cycle_ns: int, auto: bool,
                prediction: Prediction | None) -> None:
        """One finished cycle, against `prediction` when the scheduler made one for it."""
        batch = len(rows)
        ledger = self._by_key[LedgerKey(report.chain, report.window if len(report.chain) > 1 else 0, batch, auto)]
        ledger.cycles += 1
        ledger.cycle_ns += cycle_ns
        ledger.emitted += sum(len(report.emitted[r.row_id]) for r in rows) / batch
        if prediction is not None:
            ledger.predicted_cycle_ns += prediction.cost_ns
            ledger.predicted_emitted += prediction.emitted
        for level, (d, v) in enumerate(chain_pairs(report.chain)):
            for r_index, r in enumerate(rows):
                accepted, checked = checks(report, v, r_index)
                entry = ledger.pairs[(d, v, mode_of(r))]
                entry.accepted += accepted
                entry.checked += checked
                if prediction is not None and level < len(prediction.checks):
                    entry.predicted_accepted += prediction.checks[level][0]
                    entry.predicted_checked += prediction.checks[level][1]

    def items(self) -> list[tuple[LedgerKey, Ledger]]:
        return list(self._by_key.items())
