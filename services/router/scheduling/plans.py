"""Plans and the planner thread: the ranked candidates per batch composition, made off the cycle's path.

Candidates are every chain of the pool that ends at the target (`candidates.py`; the target alone
included) with every window of `windows`. Their predictions (cycle_cost.predict_windows) form a plan per
batch composition (rows per decoding mode, bucketed as the profiler buckets batch sizes: exact up to 16,
then powers of two), with the acceptance of every pair shifted by a common number of log-odds steps (the
rows' prompts) and of some pairs by more (the rows' own record). A background planner thread refreshes
the plans in use every `recompute_s` from the profiler's latest snapshot, so a decision on the cycle's
path is a dictionary lookup; only a composition never seen before, or one not asked for since its plan's
snapshot was replaced more than `plan_max_age_s` ago, is planned inline. A shift not yet planned (or a
batch's mix of lookup matches) is planned by the planner thread, the nearest planned one serving
meanwhile. Without the thread (where the router holds the models) a decision remakes its plan when it
finds it stale, within a budget of the router's time (`inline_planning_share`): past it, stale plans stand
and the nearest plan of a batch's composition serves a new key.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from specrouter.contract.measures import Mode, bucket
from specrouter.router.chain import TARGET_ONLY_BLOCK
from specrouter.router.lookup import by_match
from specrouter.router.requests import MAX_WINDOW
from specrouter.router.scheduling.acceptance import AcceptanceEstimates, shifted
from specrouter.router.scheduling.candidates import chain_pairs
from specrouter.router.scheduling.cycle_cost import Prediction, RowGroup, call_overhead, predict_windows
from specrouter.router.scheduling.draft_passes import draft_scale
from specrouter.router.scheduling.finish import FINISH_HORIZON, Finish
from specrouter.router.scheduling.latency import LatencyTable, latency_table
from specrouter.router.scheduling.settings import SchedulerSettings
from specrouter.router.scheduling.snapshot import Snapshot

log = logging.getLogger(__name__)

INLINE_WINDOW_S = 1.0   # the time constant over which the share of time spent planning inline is measured
PLANS_KEPT = 256   # plans held before those not asked for lately are dropped
CHAIN_PREDICTIONS_KEPT = 4096   # one snapshot's chain predictions held for plans to share, before they are dropped

Matches = int | tuple[int, ...] | None
"""The lookup level's matches a plan prices its chains at: one length for every row, the rows' lengths (a
batch of one decoding mode, sorted), or None (the lookup priced over every match)."""


class PlanKey(NamedTuple):
    """What a plan is made for: the batch's rows of each decoding mode (`composition`), the prompt shift of
    every pair, the record shift of `pairs` (None: every pair), and the lookup level's matches (`Matches`)."""

    greedy: int
    sampling: int
    coupled: int
    common: int
    shift: int
    pairs: frozenset[tuple[str, str]] | None
    match: Matches = None

    @property
    def composition(self) -> tuple[int, int, int]:
        """Rows per decoding mode (greedy, sampling, coupled), bucketed."""
        return self.greedy, self.sampling, self.coupled


@dataclass
class Plan:
    """The ranked candidates for one batch composition."""

    predictions: list[Prediction]
    by_key: dict[tuple[tuple[str, ...], int], Prediction]
    estimates: AcceptanceEstimates
    latency: LatencyTable
    made_at: float
    version: int
    finish: Finish | None = None   # for a one-row composition, made with it by the planner thread, or when needed


@dataclass(frozen=True)
class Inputs:
    """What one snapshot gives every plan made from it."""

    version: int
    estimates: AcceptanceEstimates
    latency: LatencyTable


def composition(greedy_rows: int, sampling_rows: int, coupled_rows: int = 0) -> tuple[int, int, int]:
    """Batch compositions planned alike: the profiler's buckets (exact up to 16, then powers of two)."""
    return tuple(bucket(n) if n else 0 for n in (greedy_rows, sampling_rows, coupled_rows))


def lower_priority(nice: int) -> None:
    """Raises the calling thread's niceness by `nice` (Linux schedules threads, so this is the thread's
    own; elsewhere, or where the OS refuses, the thread runs as it was).

    The planner shares the machine with the model workers: on a small one their passes use every core,
    and a plan made meanwhile (a few ms of CPU) slows the pass it runs beside; at batch sizes where a
    wave's tail and the shift variants keep several plans a second in use, that shows in the cycles'
    cost. A nice thread gets the cores the workers leave idle (between passes, while the drafter runs on
    one core), and the GIL it may hold is released after every chain (`Planner.make`'s pause)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:
        log.info("the scheduler's planner runs at the router's priority: %s", exc)


class Planner:
    """The plan cache, its snapshot version, and the thread that keeps the plans in use fresh.

    `snapshot` returns the profiler's latest snapshot (a new object when it changed); `on_snapshot` hears
    of each new one; `estimates` makes a snapshot's acceptance estimates; `overheads(batch size)` gives
    the router's (cycle overhead, call overheads per (model, passes), a batch-1 draft's later passes in
    single-token passes per (drafter, window)); `lock` guards what cycles write
    and plans read; `counts` is the scheduler's, which the planner adds its "plans" and "stand_ins" to;
    `free`: the levels that run no model, whose passes the latency table prices at 0."""

    def __init__(self, chains: Sequence[tuple[str, ...]], settings: SchedulerSettings,
                 snapshot: Callable[[], Snapshot | None], on_snapshot: Callable[[Snapshot, float], None],
                 estimates: Callable[[Snapshot | None], AcceptanceEstimates],
                 warmup: Mapping[str, Sequence[tuple[int, int, int]]],
                 overheads: Callable[[int], tuple[float, Mapping[tuple[str, int], float],
                                              Mapping[tuple[str, int], float]]],
                 lock: threading.RLock, clock: Callable[[], float], counts: dict[str, int],
                 free: Sequence[str] = ()):
        self.chains, self.settings = list(chains), settings
        self._snapshot, self._on_snapshot, self._estimates = snapshot, on_snapshot, estimates
        self._latency = functools.partial(latency_table, warmup=dict(warmup), free=tuple(free))
        self._free = frozenset(free)
        self._overheads, self._lock, self._clock = overheads, lock, clock
        self.plans: dict[PlanKey, Plan] = {}
        self._plans_kept = PLANS_KEPT   # plans held before the unused ones are dropped (`_forget_unused`)
        self.inputs: Inputs | None = None
        self.counts = counts   # "plans" made, "stand_ins": shifts served by the nearest planned one
        self.planning_ns = 0                      # time spent planning, all threads
        self._version = 0
        self._last_snapshot: Snapshot | None = None   # held, so that a new one is never taken for it by its id
        self._wanted: dict[PlanKey, float] = {}   # plan key -> last time a decision needed it
        self._inline: tuple[float, float] | None = None   # (load, when): planning on the cycle's path (`inline_share`)
        # predictions per chain, by what they depend on, from one snapshot and at most `recompute_s` old (the
        # router's overheads they include move every cycle): plans made meanwhile that differ in the rows'
        # matches share their chains of models, and those that differ in a record's shift of some pairs the
        # chains without them
        self._chains_made: tuple[int, float] | None = None   # (snapshot version, when) of those predictions
        self._chain_predictions: dict[tuple, list[Prediction]] = {}
        longest = max((max(self.windows(c)) for c in self.chains), default=0)
        self._finish_reach = FINISH_HORIZON + longest + 1   # tokens left a finish is costed to
        self._stop = threading.Event()
        self._wake = threading.Event()   # a decision asked for a plan the planner has not made
        self.thread: threading.Thread | None = None

    def windows(self, chain: Sequence[str]) -> list[int]:
        """The windows a chain is planned at: `windows`, and `lookup_windows` for a chain that starts with a
        model-free level, where each level above hands up one token more than it was given within the
        longest proposal a worker takes (MAX_WINDOW); [0] for the target alone."""
        if len(chain) == 1:
            return [0]
        s = self.settings
        if chain[0] not in self._free:
            return list(s.windows)
        return sorted({*s.windows, *(w for w in s.lookup_windows if w + len(chain) - 2 <= MAX_WINDOW)})

    @property
    def finish_reach(self) -> int:
        return self._finish_reach

    def start(self) -> None:
        """Starts the background planner (without it, stale plans are refreshed inline)."""
        self.thread = threading.Thread(target=self._loop, name="scheduler-planner", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def _loop(self) -> None:
        """A round every `recompute_s`, or at once when a decision asks for a shift not planned yet: a
        one-row request lasts a few rounds, and its prompt's shift (known at its first cycle) would
        otherwise wait up to a round for its plan, the nearest shift's serving meanwhile."""
        lower_priority(self.settings.planner_nice)
        while True:
            self._wake.wait(self.settings.recompute_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.refresh()
            except Exception:   # noqa: BLE001 - a bad snapshot must not stop planning for good
                log.exception("the scheduler's planner failed; it tries again in %.2f s", self.settings.recompute_s)

    def refresh(self) -> None:
        """Remakes the stale plans that a decision asked for since they were made. A plan nobody asked for
        since is left as it is until one does (it serves that decision, and is remade by the next round):
        the compositions a wave's tail passes through are asked for once or twice a wave, and remaking every
        one of them every round takes CPU time from the workers on a small machine. Plans not made yet
        come first: a stand-in serves those, a stale plan its own key."""
        now = self._clock()
        for key, used_at in sorted(self._wanted.items(), key=lambda kv: kv[0] in self.plans):
            if now - used_at > 10 * self.settings.recompute_s + 5:
                self._wanted.pop(key, None)
                continue
            plan = self.plans.get(key)
            if plan is not None and used_at <= plan.made_at:
                continue
            if plan is None or self._stale(plan):
                fresh = self.make(*key, pause=True)   # PlanKey's fields are make's first arguments
                with self._lock:
                    self.plans[key] = fresh

    def _refresh_snapshot(self) -> Snapshot | None:
        snapshot = self._snapshot()
        if snapshot is not None and snapshot is not self._last_snapshot:
            self._last_snapshot = snapshot
            self._version += 1
            self._on_snapshot(snapshot, self._clock())
        return snapshot

    def version(self) -> int:
        """The version of the profiler's latest snapshot (a new one is counted as it is seen; where none can
        be read, the last one's)."""
        try:
            self._refresh_snapshot()
        except Exception:   # noqa: BLE001 - no snapshot to read: the plans stand as they are
            log.debug("no profiler snapshot to read", exc_info=True)
        return self._version

    def _stale(self, plan: Plan) -> bool:
        self._refresh_snapshot()
        return plan.version != self._version and self._clock() - plan.made_at >= self.settings.recompute_s

    def _servable(self, plan: Plan, now: float) -> bool:
        """Whether a plan the planner has not remade may serve a decision: younger than `plan_max_age_s`,
        or made from the latest snapshot. The planner remakes the plans in use each round, but a plan
        asked for once in a while (the first cycles of a request, a shift its rows reach now and then) was
        served as it stood and remade after: on a stream that changes kind, with other requests run between
        two adaptive ones, such plans from a replaced snapshot ranked the candidates for the text before."""
        if now - plan.made_at < self.settings.plan_max_age_s:
            return True
        try:
            self._refresh_snapshot()
        except Exception:   # noqa: BLE001 - no snapshot to replan from: what stands serves
            log.debug("no profiler snapshot to replan from", exc_info=True)
            return True
        return plan.version == self._version

    def inline_share(self, now: float) -> float:
        """The share of the router's time spent making plans on the cycle's path, decayed over
        INLINE_WINDOW_S: each plan adds its duration over the window, and the sum fades by e^(-t / window)."""
        if self._inline is None:
            return 0.0
        load, then = self._inline
        return load * math.exp(-max(0.0, now - then) / INLINE_WINDOW_S)

    def _note_inline(self, now: float, seconds: float) -> None:
        self._inline = (self.inline_share(now) + seconds / INLINE_WINDOW_S, now)

    def plan(self, greedy_rows: int, sampling_rows: int, shift: int = 0,
             pairs: frozenset[tuple[str, str]] | None = None, common: int = 0, coupled_rows: int = 0,
             match: Matches = None) -> Plan:
        """The ranking for a batch composition (with the acceptance of every pair shifted by `common` steps,
        and of `pairs`, every pair if None, by `shift` more; the lookup level priced at its acceptance after
        the rows' matches, `Matches`): the standing plan, made now if there is none
        (or it is stale and no planner thread runs, or too old to serve: `_servable`). A shift the planner
        thread has not planned yet (or whose plan is too old), or for a batch of several rows a mix of
        matches, is left to it; the nearest servable planned one (by matches, then by shift) serves
        meanwhile, and with none the plan is made now. Without the thread, a plan one step of shift away
        serves, and for several rows one whose rows' match lengths differ by at most half the rows in sum;
        and while planning on the cycle's path has taken more than `inline_planning_share` of the router's
        time lately, a stale plan stands and the nearest plan of the composition serves whatever its
        matches and within `over_budget_reach` steps of shift (at batch 4 with the models in the router,
        plans for the rows' new shifts and mixes and for each new snapshot took 1.0-1.4 ms of a 20-22 ms
        cycle), each while it may serve (`_servable`). Past that, a plan is made whatever the budget:
        planning can stay past the budget for whole runs (at batch 4 through workers on the router's CPU),
        and a plan of another text's shift, or of a snapshot long replaced, prices drafts at twice what
        they emit (prose rows six steps below the tables' plans)."""
        if pairs is None:   # every pair moved by common + shift steps: one plan whichever part moves it
            common, shift = common + shift, 0
        key = PlanKey(*composition(greedy_rows, sampling_rows, coupled_rows), common, shift, pairs if shift else None,
                      match)
        now = self._wanted[key] = self._clock()
        plan = self.plans.get(key)
        planner_running = self.thread is not None and self.thread.is_alive()
        over_budget = not planner_running and self.inline_share(now) > self.settings.inline_planning_share
        if plan is not None and (planner_running or over_budget) and not self._servable(plan, now):
            plan = None
        # a batch's mix of matches changes nearly every cycle, and its decision stands over several mixes
        # anyway (`Scheduler._standing`): with the planner thread, the nearest mix serves until the thread
        # has made this one; without it, a mix whose rows' match lengths differ by at most half the batch's
        # rows in sum (made inline, each new mix cost a decision 2-4 ms at batch 4)
        mixes = sum(key.composition) > 1 and match is not None
        if plan is None and (shift or common or mixes or over_budget):
            # how far (in shift steps, in match lengths) a stand-in may be: past the inline budget, any mix
            # within `over_budget_reach` steps; with the planner thread, any shift and any mix until the
            # thread has made this one; without it, a servable plan one step away and a mix within half the
            # rows (each plan made on the cycle's path costs the cycle a few ms, and rows' shifts differ by a
            # step from request to request and move a step now and then). A lone row's match is never stood
            # in for below the budget.
            if over_budget:
                reach, match_reach = self.settings.over_budget_reach, math.inf
            elif planner_running:
                reach, match_reach = math.inf, math.inf if mixes else 0
            else:
                reach, match_reach = 1, sum(key.composition) / 2 if mixes else 0
            near = [(d, k) for k, p in self.plans.items()
                    if k.composition == key.composition and k.pairs in (key.pairs, None)
                    and (d := (match_distance(k.match, match), abs(k.common - common) + abs(k.shift - shift)))[0]
                    <= match_reach and d[1] <= reach and self._servable(p, now)]
            if near:   # the nearest by matches, then by shift
                self.counts["stand_ins"] += 1
                self._wake.set()
                return self.plans[min(near, key=lambda dk: dk[0])[1]]
        if plan is None or (not planner_running and not over_budget and self._stale(plan)):
            plan = self.plans[key] = self.make(*key)
            if len(self.plans) > self._plans_kept:
                self._forget_unused(now)
        return plan

    def _forget_unused(self, now: float) -> None:
        """Drops the plans no decision asked for within the planner's horizon (the rows' matches and shifts
        make new keys all the time in a long run: a plan per key kept for good would grow without bound),
        and keeps room for as many again before looking next time."""
        horizon = 10 * self.settings.recompute_s + 5
        for key in [k for k in list(self.plans) if now - self._wanted.get(k, -math.inf) > horizon]:
            self.plans.pop(key, None)
            self._wanted.pop(key, None)
        self._plans_kept = max(PLANS_KEPT, 2 * len(self.plans))

    def make(self, greedy_rows: int, sampling_rows: int, coupled_rows: int = 0, common: int = 0, shift: int = 0,
             pairs: frozenset[tuple[str, str]] | None = None, match: Matches = None, pause: bool = False) -> Plan:
        """The ranking for one composition, the acceptance rates of every pair shifted by `common` steps of
        log-odds and those of `pairs` (every pair if None) by `shift` more, a model-free level's after the
        rows' matches (`lookup.by_match`; `Matches`). A batch whose rows' matches differ is priced as
        groups of rows, one per match length: a row without a match hands up one token whatever the others
        copy, while each pass is as long as the longest row's. With `pause` (the planner
        thread), the GIL is offered after every chain, so that the cycle thread waiting on a worker's reply
        gets it at once, not after the interpreter's switch interval."""
        started = time.perf_counter_ns()
        now = self._clock()
        snapshot = self._refresh_snapshot()
        version = self._version
        s = self.settings
        inputs = self.inputs
        if inputs is None or inputs.version != version:   # one snapshot's estimates serve every composition
            inputs = self.inputs = Inputs(version, self._estimates(snapshot), self._latency(snapshot))
        estimates, latency = inputs.estimates, inputs.latency
        counts = {Mode.GREEDY: greedy_rows, Mode.SAMPLING: sampling_rows, Mode.COUPLED: coupled_rows}
        batch = sum(counts.values())
        step = s.batch_odds_step
        with self._lock:   # a copy: cycles add to the EMAs while this plan is made
            cycle_overhead, known, scales = self._overheads(batch)
        overhead = functools.lru_cache(maxsize=None)(functools.partial(call_overhead, known))   # per plan
        later_passes = functools.partial(draft_scale, scales)
        if (self._chains_made is None or self._chains_made[0] != version
                or now - self._chains_made[1] >= s.recompute_s or len(self._chain_predictions) > CHAIN_PREDICTIONS_KEPT):
            self._chains_made, self._chain_predictions = (version, now), {}
        predictions = []
        for chain in self.chains:
            if not all(m in latency.models() for m in chain):
                continue
            moved = tuple(step * (common + (shift if pairs is None or pair in pairs else 0))
                          for pair in chain_pairs(chain))
            at = match if chain[0] in self._free else None   # chains of models alone price no match
            chain_key = (chain, greedy_rows, sampling_rows, coupled_rows, moved, at)
            priced = self._chain_predictions.get(chain_key)
            if priced is None:
                priced = self._chain_predictions[chain_key] = self._predict_chain(
                    chain, counts, at, moved, estimates, latency, overhead, cycle_overhead, later_passes)
                if pause:
                    time.sleep(0)
            predictions += priced
        predictions.sort(key=lambda p: p.t_eff_ns)
        # a one-row plan's finish costs serve only its last cycles (`scoring.finish_score`), which make them
        # where none were made: the planner thread makes them with the plan, off the cycle's path
        finish = (Finish.of(predictions, FINISH_HORIZON, self._finish_reach) if pause and batch == 1 and predictions
                  else None)
        self.counts["plans"] += 1
        self.planning_ns += time.perf_counter_ns() - started
        if not pause:   # on the cycle's path, in the planner's clock's time
            end = self._clock()
            self._note_inline(end, end - now)
        return Plan(predictions, {(p.chain, p.window): p for p in predictions}, estimates, latency, now, version,
                    finish)

    def _predict_chain(self, chain: tuple[str, ...], counts: Mapping[Mode, int], match: Matches,
                       moved: Sequence[float], estimates: AcceptanceEstimates, latency, overhead, cycle_overhead: float,
                       later_passes) -> list[Prediction]:
        """One chain at each of its windows, its pairs' acceptance moved by `moved` log-odds, a model-free
        level's after the rows' `match`."""
        windows = self.windows(chain)
        depth = max(windows) + len(chain)
        groups = []
        for mode, rows, at in _row_groups(counts, match):
            rates = [estimates.rates((by_match(d, at) if at is not None and d in self._free else d, v, mode), depth)
                     for d, v in chain_pairs(chain)]
            groups.append(RowGroup(rows, [[shifted(a, odds) for a in r] if odds else r
                                          for r, odds in zip(rates, moved)]))
        return predict_windows(chain, windows, groups, latency, overhead, cycle_overhead, TARGET_ONLY_BLOCK,
                               later_passes)


def match_distance(a: Matches, b: Matches) -> float:
    """How far apart two batches' lookup matches are: the sum over rows of the difference of their sorted
    match lengths (one length stands for every row); 0 for equal matches, infinite where one is None (the
    lookup priced over every match) or the batches differ in rows."""
    if a is None or b is None:
        return 0.0 if a == b else math.inf
    rows = len(a) if isinstance(a, tuple) else len(b) if isinstance(b, tuple) else 1
    xs = a if isinstance(a, tuple) else (a,) * rows
    ys = b if isinstance(b, tuple) else (b,) * rows
    if len(xs) != len(ys):
        return math.inf
    return float(sum(abs(x - y) for x, y in zip(xs, ys)))


def _row_groups(counts: Mapping[Mode, int], match: Matches) -> list[tuple[Mode, int, int | None]]:
    """(decoding mode, rows, the lookup's match for them) for each group of rows a chain is priced over:
    one per mode, or, for a batch given its rows' matches, one per match length."""
    modes = [(mode, n) for mode, n in counts.items() if n]
    if not isinstance(match, tuple):
        return [(mode, n, match) for mode, n in modes]
    if len(modes) != 1 or len(match) != modes[0][1]:
        raise ValueError(f"the rows' matches {match} are for a batch of one decoding mode, not {dict(modes)}")
    mode = modes[0][0]
    return [(mode, match.count(m), m) for m in sorted(set(match))]
