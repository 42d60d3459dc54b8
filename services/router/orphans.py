"""States the router no longer uses, left on workers that did not answer their release.

A batch that moves off a replica (lost, or timed out while it stayed alive), or drops a model, releases its
state there without waiting. A replica that does not answer keeps the state; this list sends the release
again, every `retry_s`, until the replica answers it (a state it no longer holds counts as released) or
`give_up_s` has passed, after which the worker's own TTL reclaims the state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from specrouter.router.failures import state_unknown
from specrouter.router.workers import Worker

log = logging.getLogger(__name__)


@dataclass
class _Orphan:
    worker: Worker
    state_id: str
    since: float
    due: float


class Orphans:
    def __init__(self, fan_out: Executor | None = None, retry_s: float = 1.0, give_up_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic):
        self.fan_out = fan_out   # where releases to workers in other processes go out; None: on the caller
        self.retry_s = retry_s
        self.give_up_s = give_up_s
        self.clock = clock
        self._orphans: list[_Orphan] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._orphans)

    def release(self, worker: Worker, state_id: str) -> None:
        """Releases `state_id` on `worker` without waiting (a remote worker's release goes out on the fan-out
        pool); if it fails, it is sent again by `retry`."""
        now = self.clock()
        self._send(_Orphan(worker, state_id, since=now, due=now))

    def retry(self) -> None:
        """Sends again the releases that are due; drops those past `give_up_s`."""
        now = self.clock()
        with self._lock:
            expired = [o for o in self._orphans if now - o.since > self.give_up_s]
            due = [o for o in self._orphans if o not in expired and o.due <= now]
            self._orphans = [o for o in self._orphans if o not in expired and o not in due]
        for o in expired:
            log.warning("state %s on %s was not released in %.0f s; the worker's TTL reclaims it", o.state_id,
                        o.worker.name, self.give_up_s)
        for o in due:
            self._send(o)

    def _send(self, orphan: _Orphan) -> None:
        def send() -> None:
            try:
                orphan.worker.release(orphan.state_id)
            except Exception as exc:  # noqa: BLE001 - sent again later, or reclaimed by its TTL
                if not state_unknown(exc):
                    orphan.due = self.clock() + self.retry_s
                    with self._lock:
                        self._orphans.append(orphan)
                    log.debug("release of state %s on %s failed; sent again in %.1f s: %s", orphan.state_id,
                              orphan.worker.name, self.retry_s, exc)

        if self.fan_out is not None and orphan.worker.remote:
            self.fan_out.submit(send)
        else:
            send()
