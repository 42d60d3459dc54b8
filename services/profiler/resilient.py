"""The metric store as the server sees it: it keeps answering while the store is unreachable.

- Snapshot reads the store each time and remembers the result. When the store cannot be read it returns
  the last metrics read, marked stale with their age (empty if none was ever read).
- Report writes through. When the store cannot be written the report is dropped, not buffered, and
  counted; the outage and its count are logged when it starts, every LOG_EVERY_S while it lasts, and when
  it ends. Why not buffer and replay: measurements are a stream (every cycle of every router brings
  fresh ones) and the EMAs forget old ones anyway (latency within tens of reports, acceptance within a
  few hundred checks), so a replay would mostly add outdated values as if they were new; and a write
  that timed out may have been applied, so a replay could count it twice. A replica's dropped reports
  are in every snapshot (`reports_dropped`).
- After a failure, calls within `retry_s` do not touch the store, so an unreachable Redis does not hold
  every handler thread for a timeout; the first call after that tries again, and success ends the outage.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specrouter.profiler.errors import StoreUnavailable
from specrouter.contract.measures import EmaConstants
from specrouter.profiler.metrics import MetricsSnapshot, Update
from specrouter.profiler.store import MetricStore

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class SnapshotView:
    metrics: MetricsSnapshot
    stale: bool
    age_ms: int
    constants: EmaConstants
    reports_dropped: int


class ResilientMetrics:
    def __init__(self, store: MetricStore, retry_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._store = store
        self._retry_s = retry_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last, self._last_at = MetricsSnapshot(), clock()
        self._down_since: float | None = None
        self._answered_at = clock()   # the store's last answer (read or write)
        self._failed_at = self._logged_at = -math.inf
        self._dropped = self._dropped_in_outage = 0

    def report(self, updates: Sequence[Update]) -> bool:
        """Applies the updates; False when they were dropped because the store is unreachable."""
        if self._may_try():
            try:
                self._store.apply(updates)
            except StoreUnavailable as error:
                self._failed(error)
            else:
                self._succeeded()
                return True
        self._drop(len(updates))
        return False

    def snapshot(self) -> SnapshotView:
        if self._may_try():
            try:
                metrics = MetricsSnapshot.from_records(self._store.records())
            except StoreUnavailable as error:
                self._failed(error)
            else:
                with self._lock:
                    self._last, self._last_at = metrics, self._clock()
                self._succeeded()
                return SnapshotView(metrics, False, 0, self._store.constants, self._dropped)
        with self._lock:
            age_ms = round((self._clock() - self._last_at) * 1000)
            return SnapshotView(self._last, True, age_ms, self._store.constants, self._dropped)

    def store_down_s(self) -> float | None:
        """While the store is down, seconds since it last answered (the age of what snapshots serve); else None."""
        with self._lock:
            return None if self._down_since is None else self._clock() - self._answered_at

    def _may_try(self) -> bool:
        with self._lock:
            return self._clock() - self._failed_at >= self._retry_s

    def _failed(self, error: StoreUnavailable) -> None:
        with self._lock:
            self._failed_at = now = self._clock()
            if self._down_since is None:
                self._down_since, self._logged_at = now, now
                log.warning("metric store unavailable (%s): serving the last snapshot as stale "
                            "and dropping reports until it returns", error)

    def _succeeded(self) -> None:
        with self._lock:
            self._answered_at = self._clock()
            if self._down_since is None:
                return
            log.warning("metric store is back after %.1f s; %d report(s) were dropped while it was down",
                        self._clock() - self._down_since, self._dropped_in_outage)
            self._down_since, self._failed_at, self._dropped_in_outage = None, -math.inf, 0

    def _drop(self, measurements: int) -> None:
        with self._lock:
            self._dropped += 1
            self._dropped_in_outage += 1
            now = self._clock()
            log.debug("dropped a report of %d measurement(s)", measurements)
            if now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning("metric store still unavailable: %d report(s) dropped in this outage",
                            self._dropped_in_outage)
