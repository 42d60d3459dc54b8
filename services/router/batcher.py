"""Continuous batching: requests join and leave the running batches between cycles.

One loop thread owns every `ChainBatch`. Requests that ask for the same static (chain, window), or
leave the choice to the router, share a batch; each row keeps its own sampling parameters and seed.
Between cycles the loop admits new requests (prefill joins them to their batch; those that came in during
that prefill are admitted too, so a burst starts as one batch), drops cancelled ones (their worker rows
are released), runs one cycle per batch, hands emitted tokens to each request's handle and lets finished
rows go (the rows that stay do not wait for their release). Each batch runs on one replica of each model
(`placement`), the least loaded when it starts. A replica that fails a call of a model other than the
target is taken out (`health`): its batch drops the model and goes on over the chains that remain, with no
row lost, and new batches start on the model's other replicas, or without it until one answers again;
requests that named a chain through it fail UNAVAILABLE. A target replica that is lost moves its batch to
another replica of the target, the rows joining again from their tokens with the same output (`_recover`);
with none left the rows wait for one to answer again (a worker restarting), up to `target_wait_s`
(`_target_answers`); on any other failure of the target, the rows of its batch fail, and only those. A
worker whose state of the batch is out of line with the rows (a release it missed, a restart, its TTL) has
it rebuilt from the rows' tokens (`ChainBatch`), and the cycle runs again. A call that a worker refuses for
some rows alone (a row past its context, a token it cannot take) ends those requests alone: the others run
the cycle again (it emitted nothing), or are prefilled again without them, with the same output. A worker
that runs out of memory in a cycle makes the batch smaller (`_shrink`): fewer rows, then a shorter window,
then a shorter chain; in a prefill, fewer rows join at a time. Its rows join again from their tokens, with
the same output.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping
from typing import NamedTuple

from opentelemetry import trace

from specrouter.router.chain import FAN_OUT, TARGET_ONLY_BLOCK, ChainBatch
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.failures import (OutOfMemory, RowsFailed, StateOutOfLine, WorkerCallFailed, out_of_memory,
                                        row_failure, state_out_of_line)
from specrouter.router.handles import CancelledError, Emitted, Failed, Finished, RequestHandle, request_span
from specrouter.router.health import ModelUnavailable, WorkerHealth
from specrouter.router.orphans import Orphans
from specrouter.router.placement import Placement
from specrouter.router.replicas import ReplicaSet
from specrouter.router.requests import GenerationRequest
from specrouter.router.stops import Decode, StopStrings
from specrouter.router.workers import Worker

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05

ChooseChain = Callable[[ChainBatch, tuple[str, ...] | None, int], tuple[tuple[str, ...], int]]
# after each cycle: (batch, report, rows, wall time of the whole cycle in ns, whether the router chose it)
CycleDone = Callable[[ChainBatch, CycleReport, list[Row], int, bool], None]


class BatchKey(NamedTuple):
    """What a batch is for: the requests' named chain (None: auto) and window (0: the scheduler's)."""

    chain: tuple[str, ...] | None
    window: int


class Batcher:
    def __init__(self, workers: Mapping[str, Worker] | ReplicaSet, target: str, context_length: int,
                 eos_token_id: int | None, choose_auto: ChooseChain,
                 decode: Decode | None = None,
                 on_cycle: Callable[[CycleReport, list[Row]], None] | None = None,
                 on_cycle_done: CycleDone | None = None, prompt_positions: int = 0,
                 health: WorkerHealth | None = None, on_emitted: Callable[[int], None] | None = None,
                 target_wait_s: float = 0.0, levels: Mapping[str, Worker] | None = None):
        # one worker per model, or every replica of each (a router's)
        self.replicas = workers if isinstance(workers, ReplicaSet) else ReplicaSet.fixed(workers)
        self.health = health or WorkerHealth(self.replicas, target)
        self.placement = Placement(self.replicas, self.health, target)
        self.levels = dict(levels or {})   # levels in this process that every batch has (the lookup)
        self.prompt_positions = prompt_positions   # prompt positions the models' guesses are compared on
        self.target = target
        self.context_length = context_length
        self.stop_tokens = frozenset() if eos_token_id is None else frozenset({eos_token_id})
        self.choose_auto = choose_auto
        self.decode = decode   # the tokenizer's, to find stop strings in the text
        self.on_cycle = on_cycle
        self.on_cycle_done = on_cycle_done
        self.on_emitted = on_emitted   # after each cycle: the tokens it handed to requests (stops applied)
        self._inbox: queue.Queue[RequestHandle] = queue.Queue()
        self._batches: dict[BatchKey, ChainBatch] = {}
        self._handles: dict[str, RequestHandle] = {}
        # rows that wait for room in their batch, bounded after a worker ran out of memory (oldest first)
        self._waiting: dict[BatchKey, deque[tuple[RequestHandle, Row]]] = defaultdict(deque)
        # how long rows wait for a replica of the target while none answers (0: they fail at once), and since
        # when each batch's rows have been waiting
        self.target_wait_s = target_wait_s
        self._held: dict[BatchKey, float] = {}
        self.orphans = Orphans(FAN_OUT)   # states left on replicas that did not answer their release
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.health.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)
        self.health.stop()

    def submit(self, request: GenerationRequest, span_context: trace.SpanContext | None = None) -> RequestHandle:
        if request.stop and self.decode is None:
            raise ValueError("a request with stop strings needs a batcher made with the tokenizer's decode")
        handle = RequestHandle(request, span_context=span_context)
        self._inbox.put(handle)
        return handle

    def running(self) -> int:
        return sum(len(b.rows) for b in self._batches.values())

    # -- the loop ---------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            if self._admit(block=not any(b.rows for b in self._batches.values())):
                # requests that came in while those were prefilled join before the first cycle: clients
                # that send together arrive a few ms apart, and a prefill takes longer than that
                self._admit(block=False)
            for key, batch in list(self._batches.items()):
                try:
                    self._drop_cancelled(batch)
                    self._admit_waiting(key, batch)
                    if batch.rows:
                        self._cycle(key, batch)
                except Exception as exc:  # noqa: BLE001 - a bug fails this batch's requests, not the router
                    log.exception("batch of chain %s failed", key.chain)
                    self._fail_batch(batch, key.chain or (self.target,), exc)
                if not batch.rows and not self._waiting.get(key):
                    del self._batches[key]
                    self._waiting.pop(key, None)
                    self._held.pop(key, None)
            self.orphans.retry()
            self.replicas.close_retired(w for b in self._batches.values() for w in b.workers.values())
        for key, batch in self._batches.items():
            for row in list(batch.rows.values()):
                self._fail(batch, row.row_id, RuntimeError("the router is shutting down"))
            for handle, _ in self._waiting.pop(key, ()):
                handle.events.put(Failed(RuntimeError("the router is shutting down")))

    def _admit(self, block: bool) -> bool:
        """Prefills the requests waiting (waiting up to IDLE_WAIT_S for one if `block`); False if none were."""
        try:
            handles = [self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()]
        except queue.Empty:
            return False
        while not self._inbox.empty():
            handles.append(self._inbox.get_nowait())
        by_key: dict[BatchKey, list[RequestHandle]] = defaultdict(list)
        for h in handles:
            if h.cancelled.is_set():   # cancelled before it was admitted: it still ends, as every request does
                h.events.put(Failed(CancelledError("request cancelled")))
            else:
                by_key[BatchKey(h.request.chain, h.request.window)].append(h)
        for key, group in by_key.items():
            self._admit_group(key, group)
        return True

    def _admit_group(self, key: BatchKey, group: list[RequestHandle]) -> None:
        """Queues `group` for the batch of `key` (a new one placed on the replicas with the least load) and
        admits as many as fit (`_admit_waiting`)."""
        batch = self._batches.get(key)
        if batch is None:
            try:
                batch = ChainBatch({**self.placement.place(self._loads()), **self.levels}, self.target,
                                   self.context_length,
                                   prompt_positions=self.prompt_positions, orphans=self.orphans)
            except ModelUnavailable as exc:
                for h in group:
                    h.events.put(Failed(exc))
                return
            self._batches[key] = batch
        self._waiting[key].extend((h, self._row(h)) for h in group)
        self._admit_waiting(key, batch)

    def _row(self, handle: RequestHandle) -> Row:
        r = handle.request
        stops = StopStrings(r.stop, self.decode) if r.stop else None
        return Row(handle.row_id, r.prompt_ids, len(r.prompt_ids), r.sampling, r.max_new_tokens, self.stop_tokens,
                   stops)

    @staticmethod
    def _release(batch: ChainBatch, rows: list[Row]) -> None:
        """Frees the rows of a failed prefill on every worker of the batch (best effort; states expire)."""
        for name, w in batch.workers.items():
            try:
                w.release(batch.state_ids[name], [r.row_id for r in rows])
            except Exception:  # noqa: BLE001 - the worker may be gone
                pass

    def _drop_cancelled(self, batch: ChainBatch) -> None:
        gone = [r for r in batch.rows if self._handles[r].cancelled.is_set()]
        if gone:
            for row in batch.remove(gone):
                self._handles.pop(row.row_id).events.put(Failed(CancelledError("request cancelled")))

    def _cycle(self, key: BatchKey, batch: ChainBatch) -> None:
        started = time.perf_counter_ns()
        chain, window = key
        error = self._missing(chain, batch)
        if error is not None:   # a model its requests named failed, and no other replica of it took over
            self._fail_batch(batch, chain, error)
            return
        auto = chain is None or (not window and len(chain) > 1)   # the target alone needs no window
        if auto:   # the scheduler's choice, within the chain or the window the requests named
            try:
                chain, window = self.choose_auto(batch, chain, window)
            except Exception:  # noqa: BLE001 - every chain emits the target's tokens: a scheduler bug costs speed
                log.exception("the scheduler failed to choose a chain; this cycle runs %s",
                              "the target alone" if chain is None else ",".join(chain))
                chain, window = (chain, window or TARGET_ONLY_BLOCK) if chain is not None else ((self.target,), 0)
            if len(chain) == 1:   # the target drafts its own block: one round trip for several tokens
                window = 0
        choose_ns = time.perf_counter_ns() - started
        rows = [r for r in batch.rows.values() if r.finish_reason is None]
        attributes = {"specrouter.chain": ",".join(chain), "specrouter.window": window,
                      "specrouter.batch_size": len(rows)}
        try:
            with request_span("cycle", [self._handles[r.row_id] for r in rows], attributes) as span:
                report = batch.step(chain, window)
                for model, accepted in report.accepted.items():
                    span.set_attribute(f"specrouter.accepted.{model}", sum(accepted) / len(accepted))
                self._observe("measurements", self.on_cycle, report, rows)   # queued inside the cycle's span
        except StateOutOfLine:   # that worker's state is rebuilt before its next call; the cycle runs again
            return
        except RowsFailed as exc:
            if exc.model != self.target and state_out_of_line(exc.cause):   # rebuilt, and out of line still
                log.warning("the state of %s stays out of line with the batch's rows (%s); the batch goes on without "
                            "it", exc.model, exc.cause)
                batch.drop_model(exc.model)   # a drafter's lost state costs speed, never a request
                return
            gone = batch.remove(list(exc.row_ids))   # those rows end; the others run the cycle again
            self._fail_rows(exc, [self._handles.pop(r.row_id) for r in gone])
            return
        except WorkerCallFailed as exc:
            if out_of_memory(exc.cause):
                self._shrink(key, batch, chain, window, exc)
                return
            # nothing was emitted, and every other model's state of the rows is whole: the batch goes on
            # without a drafter or intermediate verifier that failed, or on another replica of the model
            if not self._recover(key, batch, exc):
                self._fail_batch(batch, chain, exc)
            return
        except Exception as exc:  # noqa: BLE001 - a worker failure fails this batch's requests
            self._fail_batch(batch, chain, exc)
            return
        name = ",".join(chain)
        handed = 0
        for index, row in enumerate(rows):
            handle = self._handles[row.row_id]
            handle.chain_counts[name] += 1
            for model, accepted in report.accepted.items():
                handle.accepted[model].append(accepted[index])
            emitted = report.emitted[row.row_id]
            handle.events.put(Emitted(emitted))
            handed += len(emitted)
        self._observe("token count", self.on_emitted, handed)
        cycle_ns = time.perf_counter_ns() - started
        for row in rows:
            self._handles[row.row_id].breakdown.observe_cycle(report, cycle_ns, choose_ns)
        self._observe("cycle's observers", self.on_cycle_done, batch, report, rows, cycle_ns, auto)
        finished = [r.row_id for r in rows if r.finish_reason is not None]
        if finished:
            with request_span("release", [self._handles[r] for r in finished], {"specrouter.rows": len(finished)}):
                gone = batch.remove(finished, wait=False)
            for row in gone:
                handle = self._handles.pop(row.row_id)
                handle.events.put(Finished(row.finish_reason, row.generated, handle.stats(row)))

    @staticmethod
    def _observe(what: str, observer: Callable | None, *args) -> None:
        """Calls an observer of a cycle that has emitted: its failure (a bug in measuring) is logged, and the
        cycle's rows go on; their tokens are handed out already."""
        if observer is None:
            return
        try:
            observer(*args)
        except Exception:  # noqa: BLE001 - measuring must never end a request
            log.exception("the %s failed on a cycle; the batch goes on", what)

    def _shrink(self, key: BatchKey, batch: ChainBatch, chain: tuple[str, ...], window: int,
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
            self._fail_batch(batch, chain, OutOfMemory(
                f"the worker of {exc.model} ran out of memory for this request alone ({len(rows[0].tokens)} "
                f"tokens at a window of 1): send a shorter prompt or ask for fewer tokens ({exc.cause})"))
            return
        log.warning("the worker of %s ran out of memory at %d rows and a window of %d; the batch goes on with %s, "
                    "its rows prefilled again", exc.model, len(rows), used, change)
        handles = [self._handles.pop(r.row_id) for r in rows]
        batch.remove([r.row_id for r in rows])   # on every worker, the one that failed included
        if drop:
            batch.drop_model(exc.model)
        self._waiting[key].extendleft(reversed(list(zip(handles, rows))))

    def _admit_waiting(self, key: BatchKey, batch: ChainBatch) -> None:
        """Rows waiting for `batch` join it, as many as fit, the oldest first, prefilled on the models that
        are up from their tokens (a row that ran before goes on where it stopped). A prefill that a worker
        refuses for some rows ends those rows alone (a drafter's refusal drops the drafter instead); one that
        runs out of memory halves what joins, and bounds the batch (one row that cannot be prefilled into an
        empty batch ends RESOURCE_EXHAUSTED); after a replica fails, the prefill is done again without it
        (`_recover`). While no replica of the target answers, the rows wait (`_target_answers`)."""
        waiting = self._waiting.get(key)
        if not waiting:
            return
        for pair in [p for p in waiting if p[0].cancelled.is_set()]:
            waiting.remove(pair)
            pair[0].events.put(Failed(CancelledError("request cancelled")))
        retries = len(self.replicas.members())   # each retry follows a replica taken out
        while waiting and self._target_answers(key, batch):
            for model, worker in list(batch.workers.items()):
                if model != self.target and not self.health.is_up(worker):
                    batch.drop_model(model)
            error = self._missing(key.chain, batch)
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
                self._release(batch, rows)
                if isinstance(exc, StateOutOfLine):   # that worker's state is rebuilt at the next try
                    waiting.extendleft(reversed(take))
                    return
                if isinstance(exc, RowsFailed) and exc.model != self.target and state_out_of_line(exc.cause):
                    batch.drop_model(exc.model)   # a drafter's lost state costs speed, never a request
                    waiting.extendleft(reversed(take))
                    continue
                if isinstance(exc, RowsFailed):   # those rows end; the others are prefilled again
                    self._fail_rows(exc, [h for h in handles if h.row_id in exc.row_ids])
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
                elif isinstance(exc, WorkerCallFailed) and retries and self._recover(key, batch, exc, waiting=take):
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
                self._handles[h.row_id] = h

    def _target_answers(self, key: BatchKey, batch: ChainBatch) -> bool:
        """Whether the batch's replica of the target is up, or another that is takes its place (a batch with
        no rows moves at no cost). While none is, the batch's rows wait, up to `target_wait_s` from when it
        began waiting; then they fail UNAVAILABLE. With no wait allowed, the prefill is tried all the same, so
        that the target's own failure reaches the requests."""
        target = batch.workers[self.target]
        if self.target_wait_s > 0 and not self.health.is_up(target):
            spare = None if batch.rows else self.placement.spare(self.target, self._loads(), besides=target)
            if spare is None:
                now = time.monotonic()
                held = self._held.setdefault(key, now)
                if now - held < self.target_wait_s:
                    return False
                error = ModelUnavailable(
                    f"no replica of the target {self.target} has answered for {now - held:.0f} s "
                    f"({self.health.why(target)}); retry once its workers are back")
                for h, _ in self._waiting.pop(key, ()):
                    h.events.put(Failed(error))
                self._fail_batch(batch, (self.target,), error)
                self._held.pop(key, None)
                return False
            batch.workers[self.target] = spare
        if self._held.pop(key, None) is not None:
            log.warning("a replica of the target %s answers again; the rows that waited for it join again",
                        self.target)
        return True

    def _loads(self) -> Counter[int]:
        """Rows on each replica (by id), running or waiting to join their batch: what placement balances."""
        loads: Counter[int] = Counter()
        for key, batch in self._batches.items():
            rows = len(batch.rows) + len(self._waiting.get(key, ()))
            for worker in batch.workers.values():
                loads[id(worker)] += rows
        return loads

    def _recover(self, key: BatchKey, batch: ChainBatch, exc: WorkerCallFailed,
                 waiting: list[tuple[RequestHandle, Row]] = ()) -> bool:
        """Whether `batch` goes on after a call that failed as a whole (`Placement.recover`); rows that moved to
        another replica of the target, or wait for one, join again first in line, before `waiting` (rows of a
        prefill that failed, which wait again)."""
        rows = self.placement.recover(batch, exc, self._loads(), named=key.chain or (), hold=self.target_wait_s > 0)
        if rows is None:
            return False
        self._waiting[key].extendleft(reversed([*[(self._handles.pop(r.row_id), r) for r in rows], *waiting]))
        return True

    def _missing(self, chain: tuple[str, ...] | None, batch: ChainBatch) -> ModelUnavailable | None:
        """The error for requests that named a chain through a model `batch` no longer has."""
        missing = [m for m in chain or () if m not in batch.workers]
        if not missing:
            return None
        why = self.health.down().get(missing[0], "its worker failed")
        return ModelUnavailable(f"model {missing[0]} of the chain {','.join(chain)} is unavailable ({why}); retry, "
                                "or ask for chain 'auto', which runs without it")

    @staticmethod
    def _fail_rows(exc: RowsFailed, handles: list[RequestHandle]) -> None:
        """Ends the requests of rows that a worker refused, each with its own error; their batch goes on."""
        error = row_failure(exc)
        log.warning("%d request(s) ended alone (%s): %s", len(handles), error.code.name, error)
        for h in handles:
            h.events.put(Failed(error))

    def _fail_batch(self, batch: ChainBatch, chain: tuple[str, ...], exc: Exception) -> None:
        log.warning("cycle of chain %s failed: %s", ",".join(chain), exc)
        for row_id in list(batch.rows):
            self._fail(batch, row_id, exc)

    def _fail(self, batch: ChainBatch, row_id: str, exc: Exception) -> None:
        try:
            batch.remove([row_id])
        except Exception:  # noqa: BLE001 - the worker may be gone; its states expire by TTL
            batch.rows.pop(row_id, None)
        handle = self._handles.pop(row_id, None)
        if handle is not None:
            handle.events.put(Failed(exc))
