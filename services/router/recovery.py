"""How a batch goes on after a worker fails a call of its cycle or of its prefill as a whole.

A replica that fails a call of a model other than the target is taken out (`health`): its batch drops the
model and goes on over the chains that remain, with no row lost; requests that named a chain through it fail
UNAVAILABLE (`missing`). A target replica that is lost moves its batch to another replica of the target, the
rows joining again from their tokens with the same output (`recover`); with none left the rows wait for one
to answer again (a worker restarting), up to `target_wait_s` (`target_answers`). A worker that runs out of
memory in a cycle makes the batch smaller (`shrink`): fewer rows, then a shorter window, then a shorter
chain; its rows join again from their tokens, with the same output.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from specrouter.router.chain import TARGET_ONLY_BLOCK, ChainBatch
from specrouter.router.failures import OutOfMemory, WorkerCallFailed
from specrouter.router.handles import Failed
from specrouter.router.health import ModelUnavailable, WorkerHealth
from specrouter.router.placement import Placement
from specrouter.router.running import BatchKey, RunningBatches, Waiting

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Recovery:
    """The batcher's answers to a failed call (the module's docstring says which), over its running batches."""

    batches: RunningBatches
    placement: Placement
    health: WorkerHealth
    target: str
    target_wait_s: float   # how long rows wait for a replica of the target while none answers (0: they fail)

    def shrink(self, key: BatchKey, batch: ChainBatch, chain: tuple[str, ...], window: int,
               exc: WorkerCallFailed) -> None:
        """A worker ran out of memory in the batch's cycle, which emitted nothing. The call may have stopped
        half way through, so the rows leave every worker and join again from their tokens (the same output):
        the batch is halved first (the rows that joined last wait for room), then, for one row, the window,
        then the failing model leaves the batch's chains (not the target, nor a chain the requests named).
        A row that does not fit even so ends RESOURCE_EXHAUSTED."""
        rows = list(batch.rows.values())
        drop = False
        used = window or TARGET_ONLY_BLOCK
        if batch.max_window is not None:
            used = min(used, batch.max_window)
        if len(rows) > 1:
            batch.max_rows = len(rows) // 2
            change = f"at most {batch.max_rows} rows"
        elif used > 1:
            batch.max_window = used // 2
            change = f"a window of at most {batch.max_window}"
        elif exc.model != self.target and exc.model in batch.workers and not (key.chain and exc.model in key.chain):
            drop, change = True, f"chains without {exc.model}"
        else:
            self.batches.fail_batch(batch, chain, OutOfMemory(
                f"the worker of {exc.model} ran out of memory for this request alone ({len(rows[0].tokens)} "
                f"tokens at a window of 1): send a shorter prompt or ask for fewer tokens ({exc.cause})"))
            return
        log.warning("the worker of %s ran out of memory at %d rows and a window of %d; the batch goes on with %s, "
                    "its rows prefilled again", exc.model, len(rows), used, change)
        handles = [self.batches.handles.pop(r.row_id) for r in rows]
        batch.remove([r.row_id for r in rows])   # on every worker, the one that failed included
        if drop:
            batch.drop_model(exc.model)
        self.batches.wait_again(key, list(zip(handles, rows)))

    def recover(self, key: BatchKey, batch: ChainBatch, exc: WorkerCallFailed, waiting: list[Waiting] = ()) -> bool:
        """Whether `batch` goes on after a call that failed as a whole (`Placement.recover`); rows that moved to
        another replica of the target, or wait for one, join again first in line, before `waiting` (rows of a
        prefill that failed, which wait again)."""
        rows = self.placement.recover(batch, exc, self.batches.loads(), named=key.chain or (),
                                      hold=self.target_wait_s > 0)
        if rows is None:
            return False
        self.batches.wait_again(key, [*[(self.batches.handles.pop(r.row_id), r) for r in rows], *waiting])
        return True

    def target_answers(self, key: BatchKey, batch: ChainBatch) -> bool:
        """Whether the batch's replica of the target is up, or another that is takes its place (a batch with
        no rows moves at no cost). While none is, the batch's rows wait, up to `target_wait_s` from when it
        began waiting; then they fail UNAVAILABLE. With no wait allowed, the prefill is tried all the same, so
        that the target's own failure reaches the requests."""
        target = batch.workers[self.target]
        held = self.batches.held
        if self.target_wait_s > 0 and not self.health.is_up(target):
            spare = None if batch.rows else self.placement.spare(self.target, self.batches.loads(), besides=target)
            if spare is None:
                now = time.monotonic()
                since = held.setdefault(key, now)
                if now - since < self.target_wait_s:
                    return False
                error = ModelUnavailable(
                    f"no replica of the target {self.target} has answered for {now - since:.0f} s "
                    f"({self.health.why(target)}); retry once its workers are back")
                for h, _ in self.batches.waiting.pop(key, ()):
                    h.events.put(Failed(error))
                self.batches.fail_batch(batch, (self.target,), error)
                held.pop(key, None)
                return False
            batch.workers[self.target] = spare
        if held.pop(key, None) is not None:
            log.warning("a replica of the target %s answers again; the rows that waited for it join again",
                        self.target)
        return True

    def missing(self, chain: tuple[str, ...] | None, batch: ChainBatch) -> ModelUnavailable | None:
        """The error for requests that named a chain through a model `batch` no longer has."""
        missing = [m for m in chain or () if m not in batch.workers]
        if not missing:
            return None
        why = self.health.down().get(missing[0], "its worker failed")
        return ModelUnavailable(f"model {missing[0]} of the chain {','.join(chain)} is unavailable ({why}); retry, "
                                "or ask for chain 'auto', which runs without it")
