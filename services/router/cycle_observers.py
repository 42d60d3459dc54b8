"""Who hears about each cycle the batcher runs, and what each does with it.

The batcher tells its `CycleObserver`s, in order, three things about a cycle that emitted: its measurements
(inside the cycle's span, so what they send joins the requests' traces), the tokens it handed to requests,
and that it is done (its wall time, and whether the router chose its chain and window). An observer defines
the methods for what it watches; the others do nothing. A failing observer costs no request: the batcher
logs the failure and goes on.

The router's observers: `ProfilerReports` (the measurements to the profiler), `PrometheusCycles` (the
router's metrics) and `SchedulerFeedback` (the scheduler learns from each cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from specrouter.router.chain import ChainBatch
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row

if TYPE_CHECKING:
    from specrouter.router.chain_choice import RouterChooser
    from specrouter.router.measurements import Reporter
    from specrouter.router.prometheus import RouterMetrics
    from specrouter.router.scheduling.scheduler import Scheduler


class CycleObserver(Protocol):
    """What the batcher tells about each cycle. A class that names this protocol as its base inherits each
    method as doing nothing, and defines only those it needs."""

    def cycle_measured(self, report: CycleReport, rows: list[Row]) -> None:
        """The cycle's measurements, `rows` the rows that ran it; called inside the cycle's span."""

    def tokens_handed(self, count: int) -> None:
        """The cycle handed `count` tokens to its requests (stops applied)."""

    def cycle_done(self, batch: ChainBatch, report: CycleReport, rows: list[Row], cycle_ns: int,
                   chosen: bool) -> None:
        """The cycle is over: it took `cycle_ns` from the choice to the tokens handed out; `chosen` says whether
        the router chose its chain and window (the requests named neither or not both)."""


class CycleObservers(CycleObserver):
    """Several observers as one, each told in the order given. A failure stops the ones after it for that
    call (the batcher logs it); the next call tells them all again."""

    def __init__(self, observers: Sequence[CycleObserver] = ()):
        self.observers = list(observers)

    def cycle_measured(self, report: CycleReport, rows: list[Row]) -> None:
        for observer in self.observers:
            observer.cycle_measured(report, rows)

    def tokens_handed(self, count: int) -> None:
        for observer in self.observers:
            observer.tokens_handed(count)

    def cycle_done(self, batch: ChainBatch, report: CycleReport, rows: list[Row], cycle_ns: int,
                   chosen: bool) -> None:
        for observer in self.observers:
            observer.cycle_done(batch, report, rows, cycle_ns, chosen)


class ProfilerReports(CycleObserver):
    """Queues each cycle's measurements for the profiler (`measurements.Reporter` sends them)."""

    def __init__(self, reporter: Reporter):
        self.reporter = reporter

    def cycle_measured(self, report: CycleReport, rows: list[Row]) -> None:
        self.reporter.observe(report, rows)


class PrometheusCycles(CycleObserver):
    """Counts each cycle and the tokens it handed out in the router's Prometheus metrics, with the prediction
    the router's choice was made on beside what the cycle measured."""

    def __init__(self, metrics: RouterMetrics, chooser: RouterChooser):
        self.metrics = metrics
        self.chooser = chooser

    def tokens_handed(self, count: int) -> None:
        self.metrics.tokens.inc(count)

    def cycle_done(self, batch: ChainBatch, report: CycleReport, rows: list[Row], cycle_ns: int,
                   chosen: bool) -> None:
        decision = self.chooser.decision_for(batch) if chosen else None
        self.metrics.observe_cycle(report, rows, cycle_ns, decision.prediction if decision is not None else None)


class SchedulerFeedback(CycleObserver):
    """Hands each cycle to the scheduler, which learns the router's costs and the rows' acceptance from it,
    and its ledgers compare the cycle with the decision it ran on."""

    def __init__(self, scheduler: Scheduler, chooser: RouterChooser):
        self.scheduler = scheduler
        self.chooser = chooser

    def cycle_done(self, batch: ChainBatch, report: CycleReport, rows: list[Row], cycle_ns: int,
                   chosen: bool) -> None:
        decision = self.chooser.decision_for(batch) if chosen else None
        self.scheduler.observe(report, rows, cycle_ns, chosen, decision)
