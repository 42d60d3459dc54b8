"""The profiler's Prometheus metrics: reports received (stored or dropped), snapshots served (fresh or
stale), whether the metric store answers and for how long it has not. docs/deployment.md lists them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from specrouter.prometheus import RpcMetrics, new_registry
from specrouter.profiler.resilient import ResilientMetrics


class ProfilerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or new_registry()
        self.rpc = RpcMetrics(r)
        self.reports = Counter("specrouter_profiler_reports", "Reports received, by outcome (stored; dropped: the "
                               "store was unreachable)", ["outcome"], registry=r)
        self.measurements = Counter("specrouter_profiler_measurements", "Measurements in the reports received, by "
                                    "kind (forward, acceptance, similarity)", ["kind"], registry=r)
        self.snapshots = Counter("specrouter_profiler_snapshots", "Snapshots served, by freshness (fresh; stale: "
                                 "the last one read, while the store is unreachable)", ["freshness"], registry=r)
        self._store_up = Gauge("specrouter_profiler_store_up", "1 while the metric store (Redis) answers, 0 while "
                               "the profiler serves stale snapshots and drops reports", registry=r)
        self._staleness = Gauge("specrouter_profiler_store_staleness_seconds", "While the store is down, seconds "
                                "since it last answered (the age of the snapshots served); 0 while it answers",
                                registry=r)
        self._store_up.set(1)
        for outcome in ("stored", "dropped"):   # every series from the start, at 0: rates need no gap filling
            self.reports.labels(outcome)
        for kind in ("forward", "acceptance", "similarity"):
            self.measurements.labels(kind)
        for freshness in ("fresh", "stale"):
            self.snapshots.labels(freshness)

    def watch(self, metrics: ResilientMetrics) -> None:
        """Reads the store's state from `metrics` at each scrape."""
        self._store_up.set_function(lambda: float(metrics.store_down_s() is None))
        self._staleness.set_function(lambda: metrics.store_down_s() or 0.0)

    def observe_report(self, stored: bool, forward: int, acceptance: int, similarity: int) -> None:
        self.reports.labels("stored" if stored else "dropped").inc()
        for kind, n in (("forward", forward), ("acceptance", acceptance), ("similarity", similarity)):
            self.measurements.labels(kind).inc(n)

    def observe_snapshot(self, stale: bool) -> None:
        self.snapshots.labels("stale" if stale else "fresh").inc()
