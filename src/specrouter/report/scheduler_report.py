"""`specrouter scheduler-report`: every static (chain, window) against the adaptive scheduler, side by side.

For each workload kind and batch size, the same requests run once per configuration, through a router:
target-only, every chain of the pool at every window asked for, and `auto` (the adaptive scheduler).
The requests go in waves of B (batch size B: B requests in flight together, batched by the router), and
every wave runs under every configuration before the next wave starts: `auto` first (so what it knows
of the workload comes from earlier waves, never from the same requests run statically), then the static
configurations in a shuffled order. Interleaving at this grain spreads every configuration's runs over
the whole measurement, so a machine that slows down for a while slows all of them alike. A configuration's
tokens per second are its tokens over its seconds summed over the waves; with `repeats` passes, the
median pass. One unmeasured `auto` run of the first wave comes first.

Measured per configuration: tokens per second at the client; T_eff measured at the router (its cycles'
wall time over the tokens they emitted per row, read from the router's ledgers before and after the run)
beside the scheduler's prediction for the same configuration taken just before the run; for adaptive
runs, the scheduler's predicted acceptance of every pair beside the realized one over the same cycles.
A static configuration's measured T_eff counts the cycles that ran at the run's batch size, as its
prediction does: the rows of a wave join and finish apart, the cycles of the few rows left at the end
cost less per row, and a long window spends more of its time in them, so over all cycles a long window
can look as good as a shorter one that the clients measure faster. Both are reported.

A switching run sends the requests of one kind, then of another, as one stream; every static
configuration and the adaptive scheduler run it the same way.

The best of many configurations measured once is biased upwards: on a shared machine a configuration's
speed varies from one pass to the next by more than separates several of the statics, so the plain best
is partly the luckiest. The run-off settles it: after the screening passes, `runoff_passes` more passes
run `auto`, target-only and the `runoff_top` fastest statics of the screening (picked there, measured
afresh, so the pick does not inflate the figure), again wave by wave; the checks compare those. Both the
screening and the run-off figures are reported. Where the batch size leaves few waves (8 requests are 8
waves at batch 1 but 2 at batch 4), the run-off takes more passes, until every configuration has run
`runoff_waves` waves: a few waves leave the ratio of adaptive over the best static too uncertain to
decide a check, and the best of two statics measured on few waves is biased upwards by the luckier one.

The pieces: `scheduler_runs` drives the router and measures, `scheduler_stats` sums and summarises,
`scheduler_checks` judges, `scheduler_format` writes the text, over the records of `scheduler_results`.
"""

from __future__ import annotations

import sys

from specrouter.report.scheduler_format import format_report
from specrouter.report.scheduler_results import Config, Report
from specrouter.report.scheduler_runs import ReportSettings, SchedulerReport

__all__ = ["Config", "Report", "ReportSettings", "SchedulerReport", "format_report", "log_line"]


def log_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
