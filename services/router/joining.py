"""How waiting rows join their batch: a prefill on the batch's models, and what a failed prefill does.

Rows join as many as fit, the oldest first, prefilled on the models that are up from their tokens (a row
that ran before goes on where it stopped). A prefill that a worker refuses for some rows ends those rows
alone (a drafter's refusal drops the drafter instead); one that runs out of memory halves what joins, and
bounds the batch (one row that cannot be prefilled into an empty batch ends RESOURCE_EXHAUSTED); after a
replica fails, the prefill is done again without it (`Recovery.recover`). While no replica of the target
answers, the rows wait (`Recovery.target_answers`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from specrouter.router.chain import ChainBatch
from specrouter.router.row import Row
from specrouter.router.failures import (OutOfMemory, RowsFailed, StateOutOfLine, WorkerCallFailed, out_of_memory,
                                        state_out_of_line)
from specrouter.router.handles import CancelledError, Failed, request_span
from specrouter.router.health import WorkerHealth
from specrouter.router.recovery import Recovery
from specrouter.router.replicas import ReplicaSet
from specrouter.router.running import BatchKey, RunningBatches

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Joining:
    """Joins the rows waiting for each running batch, on the loop's thread (the module's docstring says how)."""

    batches: RunningBatches
    recovery: Recovery
    replicas: ReplicaSet
    health: WorkerHealth
    target: str

    def join_waiting(self, key: BatchKey, batch: ChainBatch) -> None:
        """Rows waiting for `batch` join it, as many as fit, the oldest first (the module's docstring says
        what a failed prefill does); cancelled ones end instead."""
        waiting = self.batches.waiting.get(key)
        if not waiting:
            return
        for pair in [p for p in waiting if p[0].cancelled.is_set()]:
            waiting.remove(pair)
            pair[0].events.put(Failed(CancelledError("request cancelled")))
        retries = len(self.replicas.members())   # each retry follows a replica taken out
        while waiting and self.recovery.target_answers(key, batch):
            for model, worker in list(batch.workers.items()):
                if model != self.target and not self.health.is_up(worker):
                    batch.drop_model(model)
            error = self.recovery.missing(key.chain, batch)
            if error is not None:
                while waiting:
                    waiting.popleft()[0].events.put(Failed(error))
                return
            room = batch.room()
            take = [waiting.popleft() for _ in range(len(waiting) if room is None else min(room, len(waiting)))]
            if not take:
                return
            handles, rows = [h for h, _ in take], [r for _, r in take]
            started = time.perf_counter_ns()
            try:
                with request_span("prefill", handles, {"specrouter.rows": len(rows)}):
                    batch.add(rows)
            except Exception as exc:  # noqa: BLE001 - these rows wait again, or fail alone
                self.release(batch, rows)
                if isinstance(exc, StateOutOfLine):   # that worker's state is rebuilt at the next try
                    waiting.extendleft(reversed(take))
                    return
                if isinstance(exc, RowsFailed) and exc.model != self.target and state_out_of_line(exc.cause):
                    batch.drop_model(exc.model)   # a drafter's lost state costs speed, never a request
                    waiting.extendleft(reversed(take))
                    continue
                if isinstance(exc, RowsFailed):   # those rows end; the others are prefilled again
                    self.batches.fail_rows(exc, [h for h in handles if h.row_id in exc.row_ids])
                    waiting.extendleft(reversed([p for p in take if p[0].row_id not in exc.row_ids]))
                    continue
                if isinstance(exc, WorkerCallFailed) and out_of_memory(exc.cause) and (batch.rows or len(rows) > 1):
                    batch.max_rows = len(batch.rows) + len(rows) // 2
                    log.warning("the worker of %s ran out of memory prefilling %d row(s) beside %d; at most %d rows "
                                "from now on", exc.model, len(rows), len(batch.rows), batch.max_rows)
                    waiting.extendleft(reversed(take))
                    continue
                if isinstance(exc, WorkerCallFailed) and out_of_memory(exc.cause):
                    exc = OutOfMemory(f"the worker of {exc.model} ran out of memory for this request's prefill "
                                      f"alone ({len(rows[0].tokens)} tokens): send a shorter prompt ({exc.cause})")
                elif isinstance(exc, WorkerCallFailed) and retries and self.recovery.recover(key, batch, exc,
                                                                                             waiting=take):
                    retries -= 1
                    continue
                log.warning("prefill failed: %s", exc)
                for h in handles:
                    h.events.put(Failed(exc))
                continue
            now = time.perf_counter_ns()
            for h in handles:
                h.breakdown.prefill_ns += now - started
                h.joined_ns = h.joined_ns or now
                self.batches.handles[h.row_id] = h

    @staticmethod
    def release(batch: ChainBatch, rows: list[Row]) -> None:
        """Frees the rows of a failed prefill on every worker of the batch (best effort; states expire)."""
        for name, w in batch.workers.items():
            try:
                w.release(batch.state_ids[name], [r.row_id for r in rows])
            except Exception:  # noqa: BLE001 - the worker may be gone
                pass
