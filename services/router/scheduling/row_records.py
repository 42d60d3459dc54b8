"""Each row's own acceptance, against the prediction it ran under, and the batch's shift that follows.

The acceptance the profiler holds is the pool's, over every batch; a batch's own rows may do better or
worse (the rows left at the end of a wave are the ones that drafted worst: they took the most cycles).
Each row keeps a record of its accepted tokens against the pool's prediction (decayed by `row_memory` a
cycle, drafted or not); over the batch's rows, shrunk by `row_prior_checks` checks per row towards the
prediction, it gives the batch's shift in log-odds, rounded to `batch_odds_step` (`batch_shift`). The
shift goes further down (`batch_odds_down`) than up (`batch_odds_up`): rows that drafted worse stay
worse (they are what a wave's tail is made of), while a streak of easy tokens mostly ends. The prior is
per row because each row's streak regresses on its own and each row adds its own checks to the batch's
record: one prior for the whole batch held a lone row to under half of its record while a batch of 16
rows outweighed it tenfold.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.scheduling.acceptance import logit
from specrouter.router.scheduling.candidates import chain_pairs
from specrouter.router.scheduling.cycle_cost import Prediction
from specrouter.router.scheduling.ledger import Tally, checks
from specrouter.router.scheduling.settings import SchedulerSettings


def batch_shift(records: Sequence[Tally], prior_checks: float, step: float, down: float, up: float) -> int:
    """The rows' acceptance against the pool's prediction, as a log-odds shift in whole `step`s.

    Over the rows' records: realized rate rho (shrunk by `prior_checks` per row towards the predicted rate pi),
    shift = logit(rho) - logit(pi), clipped to [-`down`, `up`]. 0 until the rows have a prediction to
    compare."""
    if step <= 0:
        return 0
    acc = sum(r.accepted for r in records)
    tried = sum(r.checked for r in records)
    p_acc = sum(r.predicted_accepted for r in records)
    p_tried = sum(r.predicted_checked for r in records)
    if p_tried <= 0:
        return 0
    pi = p_acc / p_tried
    prior = prior_checks * len(records)
    rho = (acc + prior * pi) / (tried + prior)
    shift = max(-down, min(up, logit(rho) - logit(pi)))
    return int(round(shift / step))


class RowRecords:
    """Per row, its record (a `Tally`), kept as long as the row lives."""

    def __init__(self, settings: SchedulerSettings):
        self.settings = settings
        self._records: dict[int, Tally] = {}   # id of the row -> its record

    def __getitem__(self, row: Row) -> Tally:
        record = self._records.get(id(row))
        if record is None:
            record = self[row] = Tally()
        return record

    def __setitem__(self, row: Row, record: Tally) -> None:
        if id(row) not in self._records:
            weakref.finalize(row, self._records.pop, id(row), None)
        self._records[id(row)] = record

    def observe(self, report: CycleReport, rows: Sequence[Row], base: Prediction | None) -> None:
        """Each row's drafts against `base` (the cycle's prediction under the pool's acceptance). The record
        ages every cycle, drafted or not, so that a row that went to target-only on a bad streak drifts
        back to the pool's rate (its record would otherwise stand still and keep it there)."""
        levels = list(enumerate(chain_pairs(report.chain)[: len(base.checks)])) if base is not None else []
        for r_index, r in enumerate(rows):
            record = self[r]
            record.decay(self.settings.row_memory)
            for level, (_, v) in levels:
                accepted, checked = checks(report, v, r_index)
                record.accepted += accepted
                record.checked += checked
                record.predicted_accepted += base.checks[level][0]
                record.predicted_checked += base.checks[level][1]

    def value(self, rows: Sequence[Row]) -> int:
        """The batch's shift from its rows' records (`batch_shift`)."""
        s = self.settings
        return batch_shift([self[r] for r in rows], s.row_prior_checks, s.batch_odds_step, s.batch_odds_down,
                           s.batch_odds_up)
