"""Continuous batching: requests join and leave the running batches between cycles.

One loop thread owns every `ChainBatch` (`running.py`). Requests that ask for the same static (chain, window),
or leave the choice to the router, share a batch; each row keeps its own sampling parameters and seed. Between
cycles the loop admits new requests (a prefill joins them to their batch, `joining.py`; those that came in
during that prefill are admitted too, so a burst starts as one batch), drops cancelled ones (their worker
rows are released) and runs one cycle per batch, in steps (`_cycle`):

1. choose: the chain and window, the requests' or, where they left either to the router, its `ChainChooser`'s;
2. run: `ChainBatch.step` on the batch's workers;
3. emit: the tokens to each request's handle;
4. report: the cycle to the `CycleObserver`s (the profiler, metrics, the scheduler);
5. finish: rows that are done leave the batch (the rows that stay do not wait for their release).

Each batch runs on one replica of each model (`placement`), the least loaded when it starts. A worker whose
state of the batch is out of line with the rows (a release it missed, a restart, its TTL) has it rebuilt from
the rows' tokens (`ChainBatch`), and the cycle runs again. A call that a worker refuses for some rows alone (a
row past its context, a token it cannot take) ends those requests alone: the others run the cycle again (it
emitted nothing). A call that fails as a whole is `recovery.py`'s: the batch goes on without a failed drafter,
on another replica of the target, or smaller after a worker ran out of memory; on any other failure of the
target, the rows of its batch fail, and only those.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from opentelemetry import trace

from specrouter.router.chain import FAN_OUT, TARGET_ONLY_BLOCK, ChainBatch, workers_of_chain
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.chain_choice import ChainChooser, DefaultChain
from specrouter.router.cycle_observers import CycleObserver, CycleObservers
from specrouter.router.failures import RowsFailed, StateOutOfLine, WorkerCallFailed, out_of_memory, state_out_of_line
from specrouter.router.handles import CancelledError, Emitted, Failed, Finished, RequestHandle, request_span
from specrouter.router.health import ModelUnavailable, WorkerHealth
from specrouter.router.joining import Joining
from specrouter.router.orphans import Orphans
from specrouter.router.pipelining import PipelineGate
from specrouter.router.placement import Placement
from specrouter.router.recovery import Recovery
from specrouter.router.replicas import ReplicaSet
from specrouter.router.requests import GenerationRequest
from specrouter.router.running import BatchKey, RunningBatches
from specrouter.router.stops import Decode, StopStrings
from specrouter.router.workers import Worker

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05


class RecentModels:
    """The models the cycles of each `auto` batch key ran lately: a row joining such a batch is prefilled at
    once on the models its key ran within the last `cycles` cycles (and on the target), the others only when
    a chain through them runs (`ChainBatch.prefill_on`). The cycles are counted over the key's batches, one
    after the other, so a request alone (a batch of its own) joins on the models the one before it ran."""

    def __init__(self, cycles: int):
        self.cycles = cycles
        self._count: dict[BatchKey, int] = {}
        self._last: dict[BatchKey, dict[str, int]] = {}

    def ran(self, key: BatchKey, chain: Sequence[str]) -> None:
        n = self._count[key] = self._count.get(key, 0) + 1
        self._last.setdefault(key, {}).update(dict.fromkeys(chain, n))

    def recent(self, key: BatchKey) -> frozenset[str] | None:
        """The models a row joining `key`'s batch is prefilled on; None (every model) before its first cycle,
        or with `cycles` 0."""
        if self.cycles <= 0 or key not in self._count:
            return None
        n = self._count[key]
        return frozenset(m for m, last in self._last[key].items() if n - last < self.cycles)


class Choice(NamedTuple):
    """A cycle's chain and window, and whether the router chose them (the requests named neither, or a chain
    of several models and no window)."""

    chain: tuple[str, ...]
    window: int
    chosen: bool


class Batcher:
    """The loop over the running batches. `chooser` picks the chain and window of the cycles the requests left
    to the router (without one: the target alone); `observers` hear about each cycle that emitted; `levels`
    are drafting levels in this process that every batch has (the lookup)."""

    def __init__(self, workers: Mapping[str, Worker] | ReplicaSet, target: str, context_length: int,
                 eos_token_id: int | None, *, chooser: ChainChooser | None = None,
                 observers: Sequence[CycleObserver] = (), decode: Decode | None = None, prompt_positions: int = 0,
                 health: WorkerHealth | None = None, target_wait_s: float = 0.0,
                 levels: Mapping[str, Worker] | None = None, pipelined: bool | PipelineGate = False,
                 lookup_fallback_window: int = 3, prefill_recent_cycles: int = 0):
        # one worker per model, or every replica of each (a router's)
        self.replicas = workers if isinstance(workers, ReplicaSet) else ReplicaSet.fixed(workers)
        self.health = health or WorkerHealth(self.replicas, target)
        self.placement = Placement(self.replicas, self.health, target)
        self.levels = dict(levels or {})
        self.prompt_positions = prompt_positions   # prompt positions the models' guesses are compared on
        # batches whose drafter drafts ahead while the levels above verify: always, or where the gate measures
        # it faster (one gate for every batch)
        self.pipelined = pipelined
        self.lookup_fallback_window = lookup_fallback_window   # `ChainBatch`'s
        # rows joining an auto batch are prefilled on the models it ran within this many cycles (0: every one)
        self.recent_models = RecentModels(prefill_recent_cycles)
        self.target = target
        self.context_length = context_length
        self.stop_tokens = frozenset() if eos_token_id is None else frozenset({eos_token_id})
        self.chooser = chooser or DefaultChain((target,))
        self.observers = CycleObservers(observers)
        self.decode = decode   # the tokenizer's, to find stop strings in the text
        self._inbox: queue.Queue[RequestHandle] = queue.Queue()
        self.batches = RunningBatches()
        self.recovery = Recovery(self.batches, self.placement, self.health, target, target_wait_s)
        self.joining = Joining(self.batches, self.recovery, self.replicas, self.health, target)
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
        return self.batches.rows()

    # -- the loop ---------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            if self._admit(block=not any(b.rows for b in self.batches.by_key.values())):
                # requests that came in while those were prefilled join before the first cycle: clients
                # that send together arrive a few ms apart, and a prefill takes longer than that
                self._admit(block=False)
            for key, batch in list(self.batches.by_key.items()):
                try:
                    self.batches.drop_cancelled(batch)
                    self.joining.join_waiting(key, batch)
                    if batch.rows:
                        self._cycle(key, batch)
                except Exception as exc:  # noqa: BLE001 - a bug fails this batch's requests, not the router
                    log.exception("batch of chain %s failed", key.chain)
                    self.batches.fail_batch(batch, key.chain or (self.target,), exc)
                if not batch.rows and not self.batches.waiting.get(key):
                    self.batches.forget(key)
            self.orphans.retry()
            self.replicas.close_retired(w for b in self.batches.by_key.values() for w in b.workers.values())
        for key, batch in self.batches.by_key.items():
            for row in list(batch.rows.values()):
                self.batches.fail(batch, row.row_id, RuntimeError("the router is shutting down"))
            for handle, _ in self.batches.waiting.pop(key, ()):
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
        admits as many as fit (`Joining.join_waiting`)."""
        batch = self.batches.by_key.get(key)
        if batch is None:
            try:
                workers = workers_of_chain(key.chain, {**self.placement.place(self.batches.loads()), **self.levels})
                batch = ChainBatch(workers, self.target, self.context_length,
                                   prompt_positions=self.prompt_positions, orphans=self.orphans,
                                   pipelined=self.pipelined, lookup_fallback_window=self.lookup_fallback_window)
                if key.chain is None:
                    batch.prefill_on = self.recent_models.recent(key)
            except ModelUnavailable as exc:
                for h in group:
                    h.events.put(Failed(exc))
                return
            self.batches.by_key[key] = batch
        self.batches.waiting[key].extend((h, self._row(h)) for h in group)
        self.joining.join_waiting(key, batch)

    def _row(self, handle: RequestHandle) -> Row:
        r = handle.request
        stops = StopStrings(r.stop, self.decode) if r.stop else None
        return Row(handle.row_id, r.prompt_ids, len(r.prompt_ids), r.sampling, r.max_new_tokens, self.stop_tokens,
                   stops)

    # -- one cycle, step by step ----------------------------------------------------------------------

    def _cycle(self, key: BatchKey, batch: ChainBatch) -> None:
        """One cycle of `batch`: choose, run, emit, report, finish. A step that ends the cycle early (a failure
        it has handled) returns None, and the steps after it do not run."""
        started = time.perf_counter_ns()
        choice = self._choose(key, batch)
        if choice is None:
            return
        choose_ns = time.perf_counter_ns() - started
        rows = [r for r in batch.rows.values() if r.finish_reason is None]
        report = self._run(key, batch, choice, rows)
        if report is None:
            return
        if key.chain is None:
            self.recent_models.ran(key, choice.chain)
            batch.prefill_on = self.recent_models.recent(key)
        handed = self._emit(choice, rows, report)
        self._report(batch, choice, rows, report, handed, started, choose_ns)
        self._finish(batch, rows)

    def _choose(self, key: BatchKey, batch: ChainBatch) -> Choice | None:
        """The chain and window of the cycle: the requests', or the chooser's where they left either to the
        router. None if the requests named a chain through a model the batch no longer has (a model that
        failed, with no other replica of it to take over): they fail UNAVAILABLE."""
        chain, window = key
        error = self.recovery.missing(chain, batch)
        if error is not None:
            self.batches.fail_batch(batch, chain, error)
            return None
        chosen = chain is None or (not window and len(chain) > 1)   # the target alone needs no window
        if chosen:   # the chooser's, within the chain or the window the requests named
            try:
                chain, window = self.chooser.choose(batch, chain, window)
            except Exception:  # noqa: BLE001 - every chain emits the target's tokens: a scheduler bug costs speed
                log.exception("the scheduler failed to choose a chain; this cycle runs %s",
                              "the target alone" if chain is None else ",".join(chain))
                chain, window = (chain, window or TARGET_ONLY_BLOCK) if chain is not None else ((self.target,), 0)
            if len(chain) == 1:   # the target drafts its own block: one round trip for several tokens
                window = 0
        return Choice(chain, window, chosen)

    def _run(self, key: BatchKey, batch: ChainBatch, choice: Choice, rows: list[Row]) -> CycleReport | None:
        """The cycle itself (`ChainBatch.step`) in a span under the requests' traces, the observers given its
        measurements inside that span. None if it emitted nothing; then a worker whose state was out of line
        has it rebuilt and the cycle runs again, rows a worker refused end alone, and a call that failed as a
        whole shrinks the batch (out of memory), moves it (`Recovery.recover`), or fails its rows."""
        chain, window = choice.chain, choice.window
        attributes = {"specrouter.chain": ",".join(chain), "specrouter.window": window,
                      "specrouter.batch_size": len(rows)}
        try:
            with request_span("cycle", [self.batches.handles[r.row_id] for r in rows], attributes) as span:
                report = batch.step(chain, window)
                for model, accepted in report.accepted.items():
                    span.set_attribute(f"specrouter.accepted.{model}", sum(accepted) / len(accepted))
                if report.ahead is not None or report.from_ahead:
                    span.set_attribute("specrouter.ahead_draft", report.ahead is not None)
                    span.set_attribute("specrouter.from_ahead", report.from_ahead)
                self._observe("measurements", self.observers.cycle_measured, report, rows)
        except StateOutOfLine:   # that worker's state is rebuilt before its next call; the cycle runs again
            return None
        except RowsFailed as exc:
            if exc.model != self.target and state_out_of_line(exc.cause):   # rebuilt, and out of line still
                log.warning("the state of %s stays out of line with the batch's rows (%s); the batch goes on without "
                            "it", exc.model, exc.cause)
                batch.drop_model(exc.model)   # a drafter's lost state costs speed, never a request
                return None
            gone = batch.remove(list(exc.row_ids))   # those rows end; the others run the cycle again
            self.batches.fail_rows(exc, [self.batches.handles.pop(r.row_id) for r in gone])
            return None
        except WorkerCallFailed as exc:
            if out_of_memory(exc.cause):
                self.recovery.shrink(key, batch, chain, window, exc)
                return None
            # nothing was emitted, and every other model's state of the rows is whole: the batch goes on
            # without a drafter or intermediate verifier that failed, or on another replica of the model
            if not self.recovery.recover(key, batch, exc):
                self.batches.fail_batch(batch, chain, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - a worker failure fails this batch's requests
            self.batches.fail_batch(batch, chain, exc)
            return None
        return report

    def _emit(self, choice: Choice, rows: list[Row], report: CycleReport) -> int:
        """Hands each row's emitted tokens to its request, and notes the cycle's chain and acceptance in the
        request's stats; the number of tokens handed out."""
        name = ",".join(choice.chain)
        handed = 0
        for index, row in enumerate(rows):
            handle = self.batches.handles[row.row_id]
            handle.chain_counts[name] += 1
            for model, accepted in report.accepted.items():
                handle.accepted[model].append(accepted[index])
            emitted = report.emitted[row.row_id]
            handle.events.put(Emitted(emitted))
            handed += len(emitted)
        return handed

    def _report(self, batch: ChainBatch, choice: Choice, rows: list[Row], report: CycleReport, handed: int,
                started: int, choose_ns: int) -> None:
        """The cycle to its observers (the tokens handed out, then the cycle with its wall time from `started`)
        and to each request's breakdown of where its time went."""
        self._observe("token count", self.observers.tokens_handed, handed)
        cycle_ns = time.perf_counter_ns() - started
        for row in rows:
            self.batches.handles[row.row_id].breakdown.observe_cycle(report, cycle_ns, choose_ns)
        self._observe("cycle's observers", self.observers.cycle_done, batch, report, rows, cycle_ns, choice.chosen)

    def _finish(self, batch: ChainBatch, rows: list[Row]) -> None:
        """Rows that finished in the cycle leave the batch, without waiting for the workers' release, and their
        requests end with their tokens and stats."""
        finished = [r.row_id for r in rows if r.finish_reason is not None]
        if finished:
            with request_span("release", [self.batches.handles[r] for r in finished],
                              {"specrouter.rows": len(finished)}):
                gone = batch.remove(finished, wait=False)
            for row in gone:
                handle = self.batches.handles.pop(row.row_id)
                handle.events.put(Finished(row.finish_reason, row.generated, handle.stats(row)))

    @staticmethod
    def _observe(what: str, observe: Callable[..., None], *args) -> None:
        """Tells the observers of a cycle that has emitted: their failure (a bug in measuring) is logged, and
        the cycle's rows go on; their tokens are handed out already."""
        try:
            observe(*args)
        except Exception:  # noqa: BLE001 - measuring must never end a request
            log.exception("the %s failed on a cycle; the batch goes on", what)
