"""What the batcher's loop holds between cycles: the running batches, their requests, the rows waiting to join.

Only the loop's thread reads or changes it. A request is in one of two places: waiting to join its batch (as
a handle and the row it runs as), or running in it (its handle found by row id). Rows wait after they arrive,
after a worker ran out of memory (the batch holds fewer rows than want to join it) and after a failure moved
the batch (they join again first in line, from their tokens).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict, deque
from typing import NamedTuple

from specrouter.router.chain import ChainBatch
from specrouter.router.row import Row
from specrouter.router.failures import RowsFailed, row_failure
from specrouter.router.handles import CancelledError, Failed, RequestHandle

log = logging.getLogger(__name__)

Waiting = tuple[RequestHandle, Row]


class BatchKey(NamedTuple):
    """What a batch is for: the requests' named chain (None: auto) and window (0: the scheduler's)."""

    chain: tuple[str, ...] | None
    window: int


class RunningBatches:
    def __init__(self):
        self.by_key: dict[BatchKey, ChainBatch] = {}
        self.handles: dict[str, RequestHandle] = {}   # of the rows running in a batch, by row id
        # rows that wait for room in their batch, bounded after a worker ran out of memory (oldest first)
        self.waiting: dict[BatchKey, deque[Waiting]] = defaultdict(deque)
        # since when each batch's rows have waited for a replica of the target to answer
        self.held: dict[BatchKey, float] = {}

    def rows(self) -> int:
        """The rows running in every batch."""
        return sum(len(b.rows) for b in self.by_key.values())

    def loads(self) -> Counter[int]:
        """Rows on each replica (by id), running or waiting to join their batch: what placement balances."""
        loads: Counter[int] = Counter()
        for key, batch in self.by_key.items():
            rows = len(batch.rows) + len(self.waiting.get(key, ()))
            for worker in batch.workers.values():
                loads[id(worker)] += rows
        return loads

    def forget(self, key: BatchKey) -> None:
        """The batch of `key` is done: no row runs in it and none waits for it."""
        del self.by_key[key]
        self.waiting.pop(key, None)
        self.held.pop(key, None)

    def wait_again(self, key: BatchKey, pairs: list[Waiting]) -> None:
        """`pairs` wait to join the batch of `key` again, first in line, in their order."""
        self.waiting[key].extendleft(reversed(pairs))

    def drop_cancelled(self, batch: ChainBatch) -> None:
        """Rows whose clients went away leave the batch (their worker rows released); the requests end."""
        gone = [r for r in batch.rows if self.handles[r].cancelled.is_set()]
        if gone:
            for row in batch.remove(gone):
                self.handles.pop(row.row_id).events.put(Failed(CancelledError("request cancelled")))

    @staticmethod
    def fail_rows(exc: RowsFailed, handles: list[RequestHandle]) -> None:
        """Ends the requests of rows that a worker refused, each with its own error; their batch goes on."""
        error = row_failure(exc)
        log.warning("%d request(s) ended alone (%s): %s", len(handles), error.code.name, error)
        for h in handles:
            h.events.put(Failed(error))

    def fail_batch(self, batch: ChainBatch, chain: tuple[str, ...], exc: Exception) -> None:
        """Ends every request running in `batch` with `exc`."""
        log.warning("cycle of chain %s failed: %s", ",".join(chain), exc)
        for row_id in list(batch.rows):
            self.fail(batch, row_id, exc)

    def fail(self, batch: ChainBatch, row_id: str, exc: Exception) -> None:
        """The row leaves `batch` (on its workers where they answer) and its request ends with `exc`."""
        try:
            batch.remove([row_id])
        except Exception:  # noqa: BLE001 - the worker may be gone; its states expire by TTL
            batch.rows.pop(row_id, None)
        handle = self.handles.pop(row_id, None)
        if handle is not None:
            handle.events.put(Failed(exc))
