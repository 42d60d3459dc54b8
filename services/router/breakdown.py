"""Where a request's time goes in the router: its cycles, split into the chain's choice, each model's
round trip (transport and serialization, the worker's handler, the model's forward passes) and the
router's own work around them. Returned with every response, so that a benchmark can tell the forward
compute from the serving overhead without a profiler attached."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from specrouter.router.cycle_report import CycleReport


@dataclass
class LevelTiming:
    """One model's calls, summed (nanoseconds)."""

    calls: int = 0
    call_ns: int = 0      # round trip as the router saw it
    handler_ns: int = 0   # the worker's handler
    forward_ns: int = 0   # the model's forward passes


@dataclass
class CycleBreakdown:
    """A request's time in the router (nanoseconds); a cycle's time counts once for each of its rows."""

    cycle_ns: int = 0
    choose_ns: int = 0
    prefill_ns: int = 0
    late_prefill_ns: int = 0   # the part of cycle_ns prefilling the row on a model that joined it late
    levels: dict[str, LevelTiming] = field(default_factory=lambda: defaultdict(LevelTiming))
    ahead: LevelTiming = field(default_factory=LevelTiming)   # a pipelined batch's ahead drafts
    cycles_from_ahead: int = 0   # cycles whose proposal an ahead draft made (no drafter call)

    def observe_cycle(self, report: CycleReport, cycle_ns: int, choose_ns: int) -> None:
        self.cycle_ns += cycle_ns
        self.choose_ns += choose_ns
        self.late_prefill_ns += report.late_prefill_ns
        for model, result in report.results.items():
            level = self.levels[model]
            level.calls += 1
            level.call_ns += report.call_ns.get(model, 0)
            level.handler_ns += result.handler_ns
            level.forward_ns += result.forward_ns
        if report.ahead is not None:
            self.ahead.calls += 1
            self.ahead.call_ns += report.ahead_ns
            self.ahead.handler_ns += report.ahead.handler_ns
            self.ahead.forward_ns += report.ahead.forward_ns
        self.cycles_from_ahead += report.from_ahead
