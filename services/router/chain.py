"""The lossless multi-level cycle over a running batch; docs/lossless.md says why its output is the target's.

For a chain [M1, ..., Mn] (Mn the target) and window W, one cycle is:
1. draft:   M1 samples W tokens per row and keeps the rows it drew them from;
2. verify:  each Mj (j = 2..n) checks the proposal handed up by M(j-1) and hands up its accepted
            prefix plus one recovered or bonus token, with its own rows;
3. emit:    the target's accepted prefix plus its token are emitted; nothing else ever is, so every
            emitted token has been verified by the target;
4. rollback: each model keeps in its state only the emitted prefix; what it must drop is sent with its
            next call, together with the emitted tokens it has not yet seen (catch-up);
5. stop:    EOS, stop strings and max_new_tokens are applied to the emitted tokens, in every cycle that
            emits (a stop string that completes in the cycle that also reaches max_new_tokens or EOS stops
            the row there); tokens after a stop are dropped.
Near the end of the context every proposal is cut to the room its rows have left (each intermediate hands
up one token more than it was given), which changes no emitted token: a shorter proposal is verified the
same way. A call that a worker refuses for some rows alone ends those rows; the others run the cycle again.
A chain of the target alone is plain decoding: the target samples a block of tokens itself in one
call (its own draft is its output, so nothing needs verifying), which spreads the round trip over the
block; tokens past a stop are dropped and rolled back like rejected drafts.

A pipelined batch (`pipelined`; docs/pipelined.md) overlaps the drafter with the levels above it: while
they verify the proposal, the drafter, a worker in another process, drafts on past it as if all of it and
its own next guesses were emitted (the ahead draft). When the cycle emits a prefix of that guessed
continuation, the rest of it is the next cycle's proposal and the drafter's call is skipped; otherwise the
ahead draft is rolled back with the rejected drafts. The levels above verify every proposal as before, so
the emitted tokens are the target's whichever proposal they saw.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from specrouter.router.failures import (RowsFailed, StateOutOfLine, WorkerCallFailed, failed_rows, state_out_of_line,
                                        state_unknown, worker_gone)
from specrouter.router.cycle_report import CycleReport
from specrouter.router.lookup import LookupProposer, shadow_checks
from specrouter.router.orphans import Orphans
from specrouter.router.pipelining import PipelineGate
from specrouter.router.row import Row, prompt_agreement
from specrouter.router.workers import Worker
from specrouter.contract.calls import DistributionRows, RowStep, StepResult, VerifyRow

T = TypeVar("T")
log = logging.getLogger(__name__)

TARGET_ONLY_BLOCK = 4     # tokens per call of a target-only cycle when the window is left open (0)
MAX_RESYNCS = 2           # rebuilds of a model's state in a row before the failure that asked for them is final
# the random-stream level of a drafter's ahead draft: no chain has that many levels, so an ahead draft never
# draws the uniforms of a fresh draft or of a verifier of the cycle it is meant for
AHEAD_STREAM_LEVEL = 255

# Calls that go to every worker (prefill, release) go out together to the workers in other processes (or
# devices), so a row joins after the slowest prefill, not after the sum of them. Engines in this process
# are called in turn on the calling thread: they share its cores anyway, and a forward pass on another
# thread would start a second OpenMP team that slows every later pass of this one.
FAN_OUT = ThreadPoolExecutor(max_workers=16, thread_name_prefix="worker-fan-out")


def workers_of_chain(chain: Sequence[str] | None, workers: Mapping[str, Worker]) -> dict[str, Worker]:
    """The workers a batch holds its rows' state on: for a named chain, its models alone (a model the chain
    never calls would only prefill every row and release it, which costs each request a prefill per such
    model); for `auto` (None), every one, since the scheduler may call any of them in any cycle. A model of
    the chain that `workers` lacks stays out: the requests that named it are told so as they join."""
    if chain is None:
        return dict(workers)
    return {m: w for m, w in workers.items() if m in chain}


def _prefill_rows(rows: Sequence[Row]) -> list[tuple[str, list[int]]]:
    """What a prefill feeds a model of each row: its tokens but the last, whose logits start the next cycle."""
    return [(r.row_id, r.tokens[:-1]) for r in rows]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    return sum(1 for _ in itertools.takewhile(lambda xy: xy[0] == xy[1], zip(a, b)))


@dataclass(frozen=True)
class AheadProposal:
    """A row's next proposal, drafted during the cycle before: `proposal` follows the row's tokens, with the
    distribution rows its tokens were drawn from (None for a greedy or coupled row), and the drafter's
    cache holds `cached` past them (the proposal's first tokens and perhaps more of the ahead draft, which
    the next ahead call rolls back)."""

    proposal: list[int]
    cached: list[int]
    rows: DistributionRows | None = None


@dataclass(frozen=True)
class Ahead:
    """The next cycle's proposals that an ahead draft left, valid for the same chain and window (a rebuilt,
    moved or dropped drafter state clears them)."""

    chain: tuple[str, ...]
    window: int
    rows: dict[str, AheadProposal]


class ChainBatch:
    """A running batch of rows and their state on every worker of the pool.

    The router's rows are the truth: a worker's state of the batch that no longer matches them (a release
    that failed, a worker that restarted or let the state expire, a replica that came back holding rows that
    moved away) is rebuilt from the rows' tokens before that worker's next call (`_resync`), so a worker's
    trouble costs time, never a row."""

    def __init__(self, workers: Mapping[str, Worker], target: str, context_length: int,
                 state_id: str | None = None, prompt_positions: int = 0, orphans: Orphans | None = None,
                 pipelined: bool | PipelineGate = False, lookup_fallback_window: int = 3):
        if target not in workers:
            raise ValueError(f"target {target!r} is not among the workers {sorted(workers)}")
        if prompt_positions < 0:
            raise ValueError(f"prompt_positions must be >= 0, got {prompt_positions}")
        if lookup_fallback_window < 0:
            raise ValueError(f"lookup_fallback_window must be >= 0, got {lookup_fallback_window}")
        self.workers = dict(workers)
        self.target = target
        self.context_length = context_length
        self.prompt_positions = prompt_positions   # last prompt positions the models' guesses are compared on
        # the id each worker holds the batch's state under: one for all, but a worker whose state could not
        # be released when it was rebuilt takes a fresh one (the old one goes to `orphans`)
        self.state_ids = dict.fromkeys(self.workers, state_id or uuid.uuid4().hex)
        self.rows: dict[str, Row] = {}
        self.orphans = Orphans(FAN_OUT) if orphans is None else orphans   # states left on workers it left
        self._releasing: list[tuple[str, list[str], Future]] = []   # (model, row ids, call): releases on their way
        self._stale: set[str] = set()   # models whose state of the batch is rebuilt before their next call
        self._resyncs: Counter[str] = Counter()   # rebuilds of each model's state since its last good call
        # bounds set when a worker ran out of memory on this batch (None: none)
        self.max_rows: int | None = None
        self.max_window: int | None = None
        # the drafter drafts ahead while the levels above verify (where it runs in another process): in
        # every cycle, or in those where the gate measures it faster than lock-step
        self.pipelined = pipelined
        # in a chain of three or more levels that starts with the lookup, a cycle where no row has a match
        # runs as the chain above it: its next level drafts this many tokens (0: it hands up one token)
        self.lookup_fallback_window = lookup_fallback_window
        self._ahead: Ahead | None = None   # what the last cycle's ahead draft left for the next one
        # the chain and window of the last cycle, where it ran an ahead draft and accepted its whole proposal
        self._ahead_ran: tuple[tuple[str, ...], int] | None = None
        # the models a joining row is prefilled on at once (None: every one); the others hold none of its
        # state until a chain through them runs (`_join_absent`), which prefills it there first
        self.prefill_on: frozenset[str] | None = None
        self._absent: dict[str, set[str]] = {}   # per model, the rows its state of the batch lacks

    def room(self) -> int | None:
        """How many more rows may join (None: no bound)."""
        return None if self.max_rows is None else max(0, self.max_rows - len(self.rows))

    # -- rows joining and leaving --------------------------------------------------------------

    def add(self, rows: Sequence[Row]) -> None:
        """Prefills new rows (all but each row's last token, which the first cycle feeds) on the models of
        `prefill_on`, the target and the lookup, or on every worker when `prefill_on` is None. A model left out
        gets the rows when a chain through it next runs (`_join_absent`): a row's prefill stalls every row of
        the batch, and a model the scheduler does not run would only have prefilled it for nothing.

        The models prefilled report their argmax guesses at the prompt's last positions, whose agreement per
        pair (`Row.prompt_agreement`) the scheduler reads; pairs with a model left out have none for the row."""
        for row in rows:
            if not row.tokens:
                raise ValueError(f"row {row.row_id!r} has an empty prompt")
            if row.row_id in self.rows:
                raise ValueError(f"row {row.row_id!r} is already running")
        self._settle_releases()
        self._bring_in_line(self.workers)
        batch = _prefill_rows(rows)
        n = self.prompt_positions
        now = self._prefilled_at_join()
        try:
            results = self._on_every_worker(lambda worker, state: worker.prefill(state, batch, n), now)
        except WorkerCallFailed as exc:
            raise self._call_failed(exc.model, exc.cause, rows) from exc.cause
        self._resyncs.clear()
        for name in self.workers:
            if name not in now:
                self._absent.setdefault(name, set()).update(r.row_id for r in rows)
        for i, r in enumerate(rows):
            # a model left out has seen none of the row: the scheduler prices its catch-up as a prefill
            r.seen = {name: len(r.tokens) - 1 if name in now else 0 for name in self.workers}
            r.spec = {name: [] for name in self.workers}
            if n:
                r.prompt_agreement = prompt_agreement({name: res.tokens[i] for name, res in results.items()})
            self.rows[r.row_id] = r

    def _prefilled_at_join(self) -> list[str]:
        """The models a joining row is prefilled on at once: `prefill_on`'s, the target and the lookup."""
        if self.prefill_on is None:
            return list(self.workers)
        return [m for m, w in self.workers.items()
                if m in self.prefill_on or m == self.target or isinstance(w, LookupProposer)]

    def _join_absent(self, chain: Sequence[str]) -> int:
        """Prefills, on each model of `chain`, the rows its state of the batch lacks (they joined while it sat
        out): their tokens but the last, as `add` does. The models' calls go out together, as a prefill's.
        Returns the wall time it took (0 when no model lacked a row)."""
        wanted = {}   # the rows each model lacks
        for m in chain:
            lacking = self._absent.get(m) and [r for r in self.rows.values() if r.row_id in self._absent[m]]
            if lacking:
                wanted[m] = lacking
        if not wanted:
            return 0
        started = time.perf_counter_ns()
        futures = {m: self._start_on_every_worker(
            lambda worker, state, fed=_prefill_rows(rows): worker.prefill(state, fed), [m])[m]
            for m, rows in wanted.items()}
        failed = None
        for m, future in futures.items():   # each answer waited for, so no call stays in flight
            cause = future.exception()
            if cause is not None:
                failed = failed or (m, cause)
                continue
            for r in wanted[m]:
                r.seen[m] = len(r.tokens) - 1
                r.spec[m] = []
            self._absent[m].difference_update(r.row_id for r in wanted[m])
        if failed is not None:
            raise self._call_failed(failed[0], failed[1], wanted[failed[0]]) from failed[1]
        return time.perf_counter_ns() - started

    def remove(self, row_ids: Sequence[str], wait: bool = True) -> list[Row]:
        """Rows leave the batch; their entries are released on every worker. With `wait=False`, while other
        rows stay, the releases to workers in other processes go out without waiting for their answers, so
        the rows that stay need not wait for them: the batch's next call, on any worker, waits for them
        first, so a worker never sees a call for rows it has not yet let go of."""
        self._settle_releases()
        gone = [self.rows.pop(r) for r in row_ids if r in self.rows]
        if not gone:
            return gone
        self._releasing = []
        for model in list(self.workers):   # each model lets go of the rows its state holds
            absent = self._absent.get(model, set())
            ids = [r.row_id for r in gone if r.row_id not in absent]
            absent.difference_update(r.row_id for r in gone)
            if ids:
                call = self._start_on_every_worker(lambda worker, state, ids=ids: worker.release(state, ids), [model])
                self._releasing.append((model, ids, call[model]))
        if wait or not self.rows:
            self._settle_releases()
        if not self.rows:   # nothing to rebuild: a state whose release failed goes as a whole, when it can
            for model in self._stale:
                self.orphans.release(self.workers[model], self.state_ids[model])
            self._stale.clear()
        return gone

    def _settle_releases(self) -> None:
        """Waits for the releases `remove` sent out. One that failed is sent again, unless its worker is
        gone; if it still fails, that worker's state is rebuilt before its next call (its rows would no
        longer match the calls' rows)."""
        releasing, self._releasing = self._releasing, []
        for model, ids, call in releasing:
            cause = call.exception()
            if cause is None or model not in self.workers:
                continue
            if not worker_gone(cause):
                try:
                    self.workers[model].release(self.state_ids[model], ids)
                    continue
                except Exception as exc:  # noqa: BLE001 - the state is rebuilt instead
                    cause = exc
            log.warning("release of %d row(s) failed on %s (%s); its state of the batch is rebuilt before its next "
                        "call", len(ids), model, cause)
            self._stale.add(model)

    def _bring_in_line(self, models: Iterable[str]) -> None:
        for model in [m for m in models if m in self._stale]:
            self._resync(model)

    def _resync(self, model: str) -> None:
        """Rebuilds `model`'s state of the batch from the rows' tokens: whatever its worker holds under the
        batch's state id is released, and every row is prefilled again (all but its last token, as `add`
        does). Nothing emitted changes: a state is a function of its tokens. If that release fails too, the
        worker rebuilds under a fresh state id, and the old state is released once it answers (`orphans`)."""
        worker, rows = self.workers[model], list(self.rows.values())
        self._resyncs[model] += 1
        self._ahead = None
        try:
            try:
                worker.release(self.state_ids[model])
            except Exception as exc:  # noqa: BLE001 - a state the worker does not hold is what a release wants
                if not state_unknown(exc):
                    self.orphans.release(worker, self.state_ids[model])
                    self.state_ids[model] = uuid.uuid4().hex
            if rows:
                worker.prefill(self.state_ids[model], _prefill_rows(rows))
        except Exception as exc:
            raise self._call_failed(model, exc, rows) from exc
        for r in rows:
            r.seen[model] = len(r.tokens) - 1
            r.spec[model] = []
        self._stale.discard(model)
        self._absent.pop(model, None)
        log.warning("the state of %d row(s) on %s was rebuilt from their tokens", len(rows), model)

    def move(self, model: str, replica: Worker) -> list[Row]:
        """`replica` serves `model` for the batch from now on, in place of the one that was lost (or the same
        one, once it answers again). The rows leave every worker (all but the lost one are told) and are
        returned: they must join the batch again, from their tokens. The batch takes a new state id, so a lost
        replica that comes back holding the old state never clashes with it; the old state is released there
        once it answers (`orphans`)."""
        lost = self.workers.pop(model)
        self._ahead = None
        try:
            gone = self.remove(list(self.rows))
        finally:
            self.workers[model] = replica
            self._absent.clear()   # no row is left to lack
        old, self.state_ids = self.state_ids, dict.fromkeys(self.workers, uuid.uuid4().hex)
        for stale in self._stale - {model}:   # releases that failed: the old state goes as a whole
            self.orphans.release(self.workers[stale], old[stale])
        self._stale.clear()
        self.orphans.release(lost, old[model])
        return gone

    def drop_model(self, model: str) -> None:
        """`model` leaves the batch (its worker failed, or its state could not be brought back in line): the
        chains through it are no longer possible here, the others go on, each model's state of the rows being
        its own. Its state of the batch is released once its worker answers (`orphans`)."""
        if model == self.target:
            raise ValueError(f"the target {model!r} cannot leave the batch")
        worker, state = self.workers.pop(model, None), self.state_ids.pop(model, None)
        self._stale.discard(model)
        self._absent.pop(model, None)
        self._ahead = None
        for r in self.rows.values():
            r.seen.pop(model, None)
            r.spec.pop(model, None)
        if worker is not None:
            self.orphans.release(worker, state)

    def _start_on_every_worker(self, call: Callable[[Worker, str], T],
                               models: Iterable[str] | None = None) -> dict[str, Future]:
        """`call(worker, its state id)` on every worker (or those of `models`), a future of its outcome by model:
        the workers in other processes on the fan-out pool, at once; the engines in this process in turn, on
        this thread, before it returns."""
        workers = self.workers if models is None else {m: self.workers[m] for m in models}
        # each call runs in a copy of this thread's context, so the calls join the caller's trace
        futures = {name: FAN_OUT.submit(contextvars.copy_context().run, call, worker, self.state_ids[name])
                   for name, worker in workers.items() if worker.remote}
        for name, worker in workers.items():
            if name not in futures:
                futures[name] = Future()
                try:
                    futures[name].set_result(call(worker, self.state_ids[name]))
                except Exception as exc:  # noqa: BLE001 - the caller reads it from the future
                    futures[name].set_exception(exc)
        return {name: futures[name] for name in workers}

    def _on_every_worker(self, call: Callable[[Worker, str], T], models: Iterable[str] | None = None) -> dict[str, T]:
        """`call` on every worker (or those of `models`) at once, its results by model; the first failure is
        raised, as a `WorkerCallFailed` naming its model, once all have answered (so that a caller cleaning up
        after it finds no call still in flight)."""
        futures = self._start_on_every_worker(call, models)
        failures = [(name, f.exception()) for name, f in futures.items()]   # waits for every one
        for name, cause in failures:
            if cause is not None:
                raise WorkerCallFailed(name, cause)
        return {name: f.result() for name, f in futures.items()}

    def release(self) -> None:
        if self.rows:
            self.remove(list(self.rows))

    def _call_failed(self, model: str, cause: BaseException, rows: Sequence[Row]) -> WorkerCallFailed:
        """The error for a failed call: `StateOutOfLine` when the worker's state of the batch is not what the
        rows say (and has not been rebuilt MAX_RESYNCS times in a row already: then it is a failure like any
        other); `RowsFailed` when the worker names rows of the call as the only ones it failed for."""
        if state_out_of_line(cause) and self._resyncs[model] < MAX_RESYNCS:
            self._stale.add(model)
            return StateOutOfLine(model, cause)
        named = set(failed_rows(cause))
        ids = [r.row_id for r in rows if r.row_id in named]
        return RowsFailed(model, cause, ids) if ids else WorkerCallFailed(model, cause)

    def lookup(self) -> LookupProposer | None:
        """The batch's model-free level, if its pool has one."""
        return next((w for w in self.workers.values() if isinstance(w, LookupProposer)), None)

    def lookup_match(self, row: Row) -> int | None:
        """The length of the lookup's match after the row's tokens (0: none), None without a lookup level."""
        lookup = self.lookup()
        return None if lookup is None else lookup.row_match(row)[1]

    # -- the cycle -----------------------------------------------------------------------------

    def step(self, chain: Sequence[str], window: int) -> CycleReport:
        chain = tuple(chain)
        self._check_chain(chain)
        rows = [r for r in self.rows.values() if r.finish_reason is None]
        if not rows:
            raise ValueError("no running rows")
        self._settle_releases()
        self._bring_in_line(chain)
        late_prefill_ns = self._join_absent(chain)
        # the most proposal tokens a level may be handed: verifying k tokens takes k + 1 positions past the
        # row's, and the longest row sets it for all (a worker checks every row for the longest proposal)
        room = max(0, min(self.context_length - len(r.tokens) - 1 for r in rows))
        if len(chain) == 1 and window == 0:   # no more tokens than the rows still want
            window = min(TARGET_ONLY_BLOCK, max(r.max_new_tokens - len(r.generated) for r in rows))
        if self.max_window is not None:
            window = min(window, self.max_window)
        # each intermediate level hands up one token more than it was given
        window = max(1, min(window, room - max(0, len(chain) - 2)))
        results: dict[str, StepResult] = {}
        call_ns: dict[str, int] = {}
        accepted: dict[str, list[int]] = {}
        proposed: dict[str, list[int]] = {}
        processed: dict[str, list[list[int]]] = {}   # per model, per row: speculative tokens it cached

        lookup = self.lookup()
        # the length of the lookup's match per row before the cycle: its checks are measured per match length
        matches = [lookup.row_match(r)[1] for r in rows] if lookup is not None else None

        drafter = chain[0]   # the target of a target-only chain drafts its own output
        ahead, self._ahead = self._ahead_for(chain, window, rows), None
        if ahead is None:
            result = self._draft(drafter, 0, window, rows, len(chain) > 1, results, call_ns)
            proposal, proposal_rows = result.tokens, result.rows
            cached = [t[:-1] for t in proposal]   # the drafter's cache past the rows' tokens
        else:
            proposal, proposal_rows = [a.proposal for a in ahead], [a.rows for a in ahead]
            cached = [a.cached for a in ahead]
        processed[drafter] = cached
        drafted = proposal
        # the ahead draft goes out now, and runs while the levels above verify
        gate = self.pipelined if isinstance(self.pipelined, PipelineGate) else None
        pipeline = gate.wants(chain, window, len(rows)) if gate is not None else self.pipelined
        running_ahead = self._start_ahead(chain, window, rows, proposal, cached, room) if pipeline else None

        try:
            self._verify_levels(chain, rows, room, proposal, proposal_rows, results, call_ns, accepted, proposed,
                                processed)
        except BaseException:
            self._settle_ahead(running_ahead, processed)
            self._abandon(rows, processed)
            raise
        ahead_result, ahead_ns = self._settle_ahead(running_ahead, processed)
        if len(chain) > 1:
            proposal = results[chain[-1]].tokens

        shadow = ({} if lookup is None or lookup is self.workers[drafter] else
                  shadow_checks(lookup, rows, {self.target: proposal, drafter: drafted}))
        emitted = {r.row_id: r.emit(tokens, self.context_length) for r, tokens in zip(rows, proposal)}
        for model, cached in processed.items():
            for r, spec in zip(rows, cached):
                new = emitted[r.row_id]
                # the last emitted token stays pending for every model: its logits start the next cycle
                keep = max(0, min(_common_prefix(spec, new), len(new) - 1))
                r.seen[model] = len(r.tokens) - len(new) + keep
                r.spec[model] = spec[keep:]
        if ahead_result is not None:
            self._ahead = self._next_ahead(chain, window, rows, emitted, processed[drafter], ahead_result)
        for r in rows:
            r.cycle += 1
        for model in chain:
            self._resyncs.pop(model, None)
        report = CycleReport(chain, window, emitted, accepted, proposed, results, call_ns,
                             model_free=isinstance(self.workers[drafter], LookupProposer), shadow=shadow,
                             matches=matches,
                             from_ahead=ahead is not None, ahead=ahead_result, ahead_ns=ahead_ns,
                             late_prefill_ns=late_prefill_ns)
        after_ahead, self._ahead_ran = self._ahead_ran == (chain, window), None
        if ahead_result is not None and report.accepted_whole():   # the next cycle may take its proposal
            self._ahead_ran = (chain, window)
        if gate is not None:
            gate.observe(report, len(rows), after_ahead)
        return report

    def _verify_levels(self, chain, rows, room, proposal, proposal_rows, results, call_ns, accepted, proposed,
                       processed) -> None:
        """Each level above the drafter checks the proposal handed up to it and hands up its own; where the
        lookup (the drafter) proposed nothing for any row, its next level drafts instead (`_draft_for_lookup`)."""
        first = 1
        if self._draft_for_lookup(chain, rows, room, proposal, results, call_ns, accepted, proposed, processed):
            proposal, proposal_rows, first = results[chain[1]].tokens, results[chain[1]].rows, 2
        for level, model in enumerate(chain[first:], start=first):
            hand_up = model != chain[-1]
            # near the end of the context a proposal is cut to the room, by its last tokens: a prefix of a
            # proposal is verified as the whole would be, so the emitted tokens are the target's still
            proposal = [p[:room] for p in proposal]
            proposal_rows = [q if q is None else q[:room] for q in proposal_rows]
            steps = [
                VerifyRow(row_id=s.row_id, pending=s.pending, sampling=s.sampling, cycle=s.cycle,
                          rollback=s.rollback, proposal=tuple(p), proposal_rows=q)
                for s, p, q in zip(self._steps(model, rows), proposal, proposal_rows)
            ]
            started = time.perf_counter_ns()
            try:
                result = self.workers[model].verify(self.state_ids[model], level, steps, hand_up)
            except Exception as exc:   # the caller rolls back what the levels before it cached
                raise self._call_failed(model, exc, rows) from exc
            call_ns[model] = time.perf_counter_ns() - started
            results[model] = result
            processed[model] = [list(p) for p in proposal]
            accepted[model] = result.accepted
            proposed[model] = [len(p) for p in proposal]
            proposal, proposal_rows = result.tokens, result.rows

    def _draft(self, model: str, level: int, window: int, rows: Sequence[Row], hand_up: bool,
               results: dict[str, StepResult], call_ns: dict[str, int]) -> StepResult:
        """`model` drafts `window` tokens for the rows at `level`; its result and the call's time are recorded
        in `results` and `call_ns`."""
        started = time.perf_counter_ns()
        try:
            result = self.workers[model].draft(self.state_ids[model], level, window, self._steps(model, rows),
                                               hand_up=hand_up)
        except Exception as exc:
            raise self._call_failed(model, exc, rows) from exc
        call_ns[model] = time.perf_counter_ns() - started
        results[model] = result
        return result

    def _draft_for_lookup(self, chain, rows, room, proposal, results, call_ns, accepted, proposed,
                          processed) -> bool:
        """In a chain of three or more levels that starts with the lookup, a cycle whose rows have no match
        at all (the lookup proposed no token) would have its next level verify nothing and hand up one token;
        that level drafts `lookup_fallback_window` tokens instead, as the drafter of the chain above the
        lookup, which the levels above then verify. True where it drafted.

        The lookup's checks are filed as in any cycle (nothing offered: rejected at its first position), the
        level's draft as its own proposal to the level above. The output stays the target's: the target
        verifies every token, whoever drafted it. A batch whose rows are mixed (some with a match, some
        without) runs the chain as it is: a level's call covers every row of the batch's state."""
        if (len(chain) < 3 or not self.lookup_fallback_window or any(proposal)
                or not isinstance(self.workers[chain[0]], LookupProposer)):
            return False
        model = chain[1]
        # each level above it but the target hands up one token more than it was given
        window = max(1, min(self.lookup_fallback_window, room - (len(chain) - 3), self.max_window or room))
        result = self._draft(model, 1, window, rows, True, results, call_ns)
        processed[model] = [t[:-1] for t in result.tokens]   # its cache past the rows' tokens, as a drafter's
        accepted[model] = [0] * len(rows)
        proposed[model] = [0] * len(rows)
        return True

    # -- the ahead draft of a pipelined batch ----------------------------------------------------------

    def _ahead_for(self, chain: tuple[str, ...], window: int, rows: Sequence[Row]) -> list[AheadProposal] | None:
        """The rows' proposals from the last cycle's ahead draft, if it left one for every row and this cycle
        runs the same chain and window; None otherwise (the drafter drafts). The drafter's state is the one
        the ahead draft left: a rebuild (`_resync`, which runs before this for a stale model), a move and a
        dropped model clear `_ahead`."""
        ahead = self._ahead
        if ahead is None or ahead.chain != chain or ahead.window != window:
            return None
        found = [ahead.rows.get(r.row_id) for r in rows]
        return None if any(a is None for a in found) else found

    def _start_ahead(self, chain: tuple[str, ...], window: int, rows: Sequence[Row], proposal: list[list[int]],
                     cached: list[list[int]], room: int) -> tuple[Future, list[list[int]], str] | None:
        """Sends the drafter its ahead draft: from the end of each row's proposal, `window` tokens plus one
        per level above it, so that after a cycle that accepts everything (each level adds a token) a whole
        window is left. Only where it can run beside the verifiers (a drafter in another process), with room
        in the context for it. Sampled rows draw it from a random stream of its own (AHEAD_STREAM_LEVEL) and
        get back the distribution rows of its tokens, which travel with the part the next cycle proposes."""
        drafter = self.workers[chain[0]]
        if len(chain) == 1 or not drafter.remote or isinstance(drafter, LookupProposer) or self.max_window:
            return None
        if any(not p for p in proposal):
            return None
        extra = window + len(chain) - 1
        if room < max(len(p) for p in proposal) + extra + 1:
            return None
        # the drafter's cache holds `cached` past the row's tokens: all but the proposal's last token stays
        steps = [RowStep(row_id=r.row_id, pending=(p[-1],), sampling=r.sampling, cycle=r.cycle + 1,
                         rollback=len(c) - (len(p) - 1)) for r, p, c in zip(rows, proposal, cached)]
        state = self.state_ids[chain[0]]

        def call() -> tuple[StepResult, int]:
            started = time.perf_counter_ns()
            result = drafter.draft(state, AHEAD_STREAM_LEVEL, extra, steps, hand_up=True)
            return result, time.perf_counter_ns() - started

        return FAN_OUT.submit(contextvars.copy_context().run, call), proposal, chain[0]

    def _settle_ahead(self, running: tuple[Future, list[list[int]], str] | None,
                      processed: dict[str, list[list[int]]]) -> tuple[StepResult | None, int]:
        """Waits for the ahead draft (no call of the batch stays in flight past its cycle) and notes what the
        drafter's cache now holds past the rows' tokens: the proposal and all but the last ahead token. An
        ahead draft that failed costs its drafter a rebuild of its state before its next call."""
        if running is None:
            return None, 0
        future, proposal, drafter = running
        try:
            result, ns = future.result()
        except Exception as exc:  # noqa: BLE001 - the ahead draft only saves time; its drafter is rebuilt
            log.warning("the ahead draft on %s failed (%s); its state of the batch is rebuilt before its next call",
                        drafter, exc)
            self._stale.add(drafter)
            return None, 0
        processed[drafter] = [[*p, *a[:-1]] for p, a in zip(proposal, result.tokens)]
        return result, ns

    def _next_ahead(self, chain: tuple[str, ...], window: int, rows: Sequence[Row], emitted: Mapping[str, list[int]],
                    cached: list[list[int]], ahead: StepResult) -> Ahead | None:
        """What the ahead draft leaves the next cycle: for each running row whose emitted tokens are a prefix of
        what the drafter guessed (its proposal, then its ahead draft), the next `window` tokens of the guess,
        with their distribution rows. Whether a row qualifies depends on the ahead draft's tokens up to the
        end of what was emitted, never on those after it, so those after it are still distributed as the
        drafter draws them after the emitted tokens: a proposal like any other."""
        out = {}
        for r, held, drafted, drafted_rows in zip(rows, cached, ahead.tokens, ahead.rows):
            new = emitted[r.row_id]
            guessed = [*held, drafted[-1]]
            start = len(new) - (len(guessed) - len(drafted))   # where the next proposal starts in the ahead draft
            if (r.finish_reason is not None or not new or guessed[: len(new)] != new or len(guessed) <= len(new)
                    or start < 0):
                continue
            out[r.row_id] = AheadProposal(guessed[len(new): len(new) + window], held[len(new):],
                                          None if drafted_rows is None else drafted_rows[start: start + window])
        return Ahead(chain, window, out) if out else None

    @staticmethod
    def _abandon(rows: Sequence[Row], processed: Mapping[str, list[list[int]]]) -> None:
        """A cycle that stops at a failed call emits nothing; the models that answered before it cached the
        rows' pending tokens and their proposal. All of that is rolled back at their next call, down to the
        row's last token, which stays pending (its logits start the next cycle)."""
        for model, cached in processed.items():
            for r, spec in zip(rows, cached):
                r.seen[model] = len(r.tokens) - 1
                r.spec[model] = [r.tokens[-1], *spec]

    def _steps(self, model: str, rows: Sequence[Row]) -> list[RowStep]:
        steps = []
        for r in rows:
            rollback, pending = r.step_for(model)
            steps.append(RowStep(row_id=r.row_id, pending=pending, sampling=r.sampling, cycle=r.cycle,
                                 rollback=rollback))
        return steps

    def _check_chain(self, chain: tuple[str, ...]) -> None:
        unknown = [m for m in chain if m not in self.workers]
        if unknown:
            raise ValueError(f"unknown models {unknown} in chain; the pool has {sorted(self.workers)}")
        if not chain or chain[-1] != self.target:
            raise ValueError(f"a chain must end at the target {self.target!r}, got {list(chain)}")
        if len(set(chain)) != len(chain):
            raise ValueError(f"a model appears twice in chain {list(chain)}")
        late = [m for m in chain[1:] if isinstance(self.workers[m], LookupProposer)]
        if late:
            raise ValueError(f"{late[0]!r} drafts without a model: it can only start a chain, got {list(chain)}")


ChainChoice = Callable[[ChainBatch], tuple[Sequence[str], int]]


def run_to_completion(batch: ChainBatch, choose: ChainChoice, on_cycle: Callable[[CycleReport], None] | None = None,
                      ) -> dict[str, Row]:
    """Runs cycles until every row has finished; finished rows leave the batch after each cycle."""
    done: dict[str, Row] = {}
    while batch.rows:
        chain, window = choose(batch)
        report = batch.step(chain, window)
        if on_cycle is not None:
            on_cycle(report)
        finished = [r.row_id for r in batch.rows.values() if r.finish_reason is not None]
        for row in batch.remove(finished):
            done[row.row_id] = row
    return done
