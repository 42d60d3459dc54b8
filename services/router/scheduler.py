"""The adaptive chain scheduler: per batch and per cycle, the (chain, window) of least predicted T_eff.

Candidates are every chain of the pool that ends at the target (the target alone included) with every
window of `windows`. Their predictions (cost_model.predict) form a plan per batch composition (rows per
decoding mode, bucketed as the profiler buckets batch sizes: exact up to 16, then powers of two). A
background planner thread refreshes the plans in use every `recompute_s` from the profiler's latest
snapshot, so a decision on the cycle's path is a dictionary lookup; only a composition never seen before,
or one not asked for since its plan's snapshot was replaced more than `plan_max_age_s` ago, is planned
inline. Requests that name their chain but not their window get the chain's best window;
those that name the window, the best chain at it. On top of the ranking:

- exploration: a pair of models that has not been measured for a while (or never) gets one cycle of
  the best chain that contains it, at its best window plus `explore_extra_window` (so deeper draft
  positions get measured too), at most once every `explore_every_cycles` cycles of the router. A while
  is `explore_after_s` for a pair whose best chain is predicted within `explore_gap` of the best, and
  proportionally longer for one further behind (up to `explore_after_max_s`): its estimate would have
  to be that much off to matter, and each exploration costs a slower cycle and a catch-up. An overdue
  pair waits for a batch whose rows its chain's models have all seen (at batch 1, a request's first
  cycle: every model prefilled it), up to `explore_patience` times its wait, so that it pays no catch-up;
- fit: no window is longer than the most tokens a row has left to emit (a cycle emits at most window + 1;
  more is drafted and verified for nothing), unless the requests named it;
- batches draft at most `batch_max_window` tokens (unless the requests named the window): the tail
  factor below treats a batch's rows as alike but for chance, and rows of one kind of text differ for
  good (on literal tables one accepts nearly every draft, another half of them); a long window speeds up
  the rows that accept well and barely the others, and the batch waits for those. With windows 7 and 8
  a batch of 4 ran 3% behind window 6 on tables in the replay, its cycles at 4 rows cheaper per token
  (1.48 against 1.71 ms) and its tail dearer (1.05 against 0.75). Modelling the rows' differences (each
  row's rate from its record or its progress, or their spread as a learned variance) did not help;
  capped at 6, batches of 4 and 16 gained on every workload but prose at 16 rows (-0.2%) in the replay
  (live, the batch-4 and batch-16 cells of run 18 did not confirm it alone; the full report on it, run
  19, put all nine cells within 5% of the best static: README);
- tail: a row's last cycle emits past its tokens left (dropped), and a batch's rows finish apart, so
  that while the last ones run the batch is small and its cycles cost nearly as much as full ones. Long
  windows emit more per cycle but more unevenly, so they overshoot more and their rows spread out more;
  candidates are ranked by T_eff times the expected cost of both (cost_model.tail_factor, weighted by
  `tail_weight`), from each row's tokens left (the batch waits for the row furthest behind) and the cost
  of the same cycle for one row. That factor is never below 1, so the candidates are taken in order of
  T_eff and scored only until the next one's T_eff reaches the best score found. A batch of one row
  is costed exactly instead: the least expected cost of finishing it from each number of tokens left
  (by dynamic programming over the candidates' emitted distributions, cost_model.best_finish), and a
  candidate scores the best T_eff plus its regret against that finish per token it emits (T_eff far
  from the end; near it, the drafts past the end and the few tokens left). With the renewal factor,
  one-row batches on prose ran their last 3-5 tokens on the target alone, where a window that fits them
  costs less;
- hysteresis: the batch keeps its chain unless another chain is predicted faster by `chain_hysteresis`,
  counting the catch-up of models that sat out (their pending tokens) spread over the cycles the batch
  is expected to run on (`switch_horizon_cycles` at most: a batch about to finish cannot earn back a
  catch-up); within its chain, or to a chain of fewer of its models, it moves when the best is predicted
  faster by `hysteresis`. A window change costs nothing; a chain that brings in models not in use costs
  their catch-up and rests on their older estimates.

The acceptance the profiler holds is the pool's, over every batch; a batch's own rows may do better or
worse (the rows left at the end of a wave are the ones that drafted worst: they took the most cycles).
Each row keeps a record of its accepted tokens against the prediction it ran under (decayed by
`row_memory` a cycle); over the batch's rows, shrunk by `row_prior_checks` checks per row towards the
prediction, it gives the batch's shift in log-odds, rounded to `batch_odds_step`, and the batch is
planned with acceptance shifted by it: upwards, only the pairs its standing chain runs (the record is
about those: on repetitive text the rows beat the pool by the cap on 1m -> 29m while 5m -> 29m, shifted
alike, was predicted 0.92 and realized 0.77-0.85); downwards, every pair (rows hard for one drafter are
hard for the others: shifting the standing chain's pairs alone made chains the rows never ran look
better). The shift goes further down (`batch_odds_down`) than up (`batch_odds_up`): rows that drafted
worse stay worse (they are what a wave's tail is made of), while a streak of easy tokens mostly ends
(greedy cycles after one predicted 2-4x the tokens they emitted). The prior is per row because each
row's streak regresses on its own and each row adds its own checks to the batch's record: one prior for
the whole batch (64 checks) held a lone row to under half of its ~10 cycles' record while a batch of 16
rows outweighed it tenfold (in the replay, 16 a row against 64 a batch: +0.4-0.7% at batch 1, level at 4,
+0.5-1.5% at 16).
A shift not yet planned is planned by the background planner, the nearest planned one serving meanwhile.

A row's prompt says how it will draft before it drafts anything: at prefill every model returns its
argmax next token at each of the prompt's last `prompt_positions` positions, and where two models agree
more, the drafts of one are accepted by the other more often (on the demo pool 1m and 29m agree on 0.59
of the positions of English prose and 0.76 of repetitive tables; greedy acceptance on the continuations
is 0.68 and 0.88). The scheduler keeps the pool's agreement per pair as an EMA over the same checks as the
profiler's acceptance rates (the rows those rates were measured on), and a batch whose rows agree more
or less than that is planned with every pair's acceptance shifted by `prompt_slope` times the difference
in log-odds, within `prompt_odds_cap`. One prompt's agreement is a noisy guess at its own acceptance
(within one kind of text they barely correlate), while the agreement of the last few rows tells one kind
from another well: each row's is shrunk by `prompt_prior_positions` towards that of the recent rows (an
EMA with `prompt_recent_alpha` per check). When the workload changes kind, the pool's rates take a few
hundred checks to follow; the shift stands in meanwhile and fades as they catch up. The record above is
kept against the plan with this shift, so it corrects what the prompt got wrong. A pair the batches
stopped running keeps the rates of the text it ran last, which the shift, weighted by the pairs' recent
use, does not correct: so each pair's measured rates are moved by `text_slope` times the log-odds
between the agreement of the rows the pool runs now and that of the rows the pair ran
(`text_shifts`), which is nothing for a pair in use.

Forward times depend on more than the batch size and tokens per row the profiler keys them by: a
pass over long contexts (a prompt of literal tables) costs the target twice what a short one does, and
the profiler's figures are averages over whatever ran lately. So the scheduler keeps, per model and
context length (the batch's longest row, in powers of two), the ratio of its passes' measured time to
what the latency table in use predicted for them, and a batch's candidates have each level scaled by its
model's ratio at the batch's context length (once `context_min_cycles` cycles measured it; within
`context_scale_range`). The target runs in every cycle: its ratio is an EMA (`context_alpha`, one
sample per cycle), and it carries what every model shares (the context, a machine that slows down).
Every other model's ratio is the target's times an EMA of its own over the target's in the cycles it
ran, which fades back towards 1 (`context_fade_alpha` per cycle) in the cycles it sits out. A model
measured slow once (the first passes of a fresh cluster run at twice the table's times) would otherwise
keep that ratio for as long as it stays out, and it stays out because of it; a model never measured at
a context length is priced like the target there, not at the table's times.

The router's own costs (one round trip per level, its work between calls) are measured here from each
cycle's wall times, as EMAs with `overhead_alpha` per batch size (a call's work beyond its passes grows
with its rows), and added to every prediction.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import os
import threading
import time
import types
import weakref
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from specrouter.pool.similarity import PairSimilarity
from specrouter.profiler.metrics import EmaConstants, bucket
from specrouter.router.chain import ChainBatch, CycleReport, Row
from specrouter.router.cost_model import LatencyTable, Prediction, RowGroup, best_finish, finish_excess, predict, tail_factor
from specrouter.router.estimates import (GREEDY, SAMPLING, AcceptanceEstimates, Pair, RecentReports, latency_table,
                                         logit, shifted)
from specrouter.v1 import profiler_pb2 as ppb

log = logging.getLogger(__name__)


class SchedulerSettings(BaseModel):
    """Every knob of the scheduler; the defaults are the ones measured best on the demo pool."""

    windows: list[int] = Field(default_factory=lambda: list(range(1, 9)))  # draft windows considered
    max_levels: int = 4                 # longest chain considered (the pool's permutations grow fast)
    recompute_s: float = 0.25           # a batch composition's ranking is at most this old
    plan_max_age_s: float = Field(1.0, gt=0.0)   # ... when in use; one older, of a replaced snapshot, is not
    #                                     served: a composition asked for again after a while is replanned
    planner_nice: int = Field(10, ge=0, le=19)   # niceness of the planner thread (Linux): it plans in the
                                        # cores' idle time, not in the workers' (0: as the router)
    hysteresis: float = 0.03            # change window only when the best is predicted this much faster
    chain_hysteresis: float = 0.10      # change chain only when the best is predicted this much faster
    switch_horizon_cycles: int = 16     # catch-up cost of a switch is spread over this many cycles at most
    explore_after_s: float = 10.0       # a pair unmeasured this long gets an exploration cycle
    explore_every_cycles: int = 50      # at most one exploration cycle per this many cycles (all batches)
    explore_extra_window: int = 1       # exploration drafts this much deeper than the chain's best window
    explore_gap: float = 0.10           # a pair whose best chain is predicted g slower than the best waits
                                        # explore_after_s * g / explore_gap (0: every pair explore_after_s)
    explore_after_max_s: float = 120.0  # ... but never longer than this
    explore_patience: float = Field(2.0, ge=1.0)  # an overdue pair waits for a batch its chain runs without
                                        # catch-up (its models saw every row's tokens: at batch 1, a request's
                                        # first cycle) until it is this many times its wait overdue
    prior_weight: float = 16.0          # pseudo-checks of the similarity prior in a position's rate
    recent_cycles: float = 50.0         # a pair's measurements fade from its estimate over this many
                                        # reports of the pool run without it (estimates.RecentReports)
    default_acceptance: float = 0.5     # prior of a pair with no similarity at all
    overhead_alpha: float = 0.05        # EMA constant of the router's own per-call and per-cycle costs
    batch_odds_step: float = 0.25       # a batch's own acceptance shifts its plan in steps of this log-odds
    batch_odds_down: float = 1.5        # ... down by this much at most (0: never)
    batch_odds_up: float = 0.5          # ... up by this much at most (a lucky streak regresses to the mean)
    row_prior_checks: float = 16.0      # pseudo-checks per row at the predicted rate in a batch's own rate
    row_memory: float = 0.9             # weight a row's acceptance record keeps a cycle (~10 cycles)
    prompt_positions: int = Field(128, ge=0)   # last prompt positions whose argmax next tokens the models
                                        # compare at prefill (0: rows are planned without their prompt)
    prompt_slope: float = Field(1.0, ge=0.0)   # a row's acceptance moves by this times its prompt agreement's
                                        # log-odds over the pool's (0: never)
    prompt_prior_positions: float = Field(128.0, ge=0.0)  # pseudo-positions at the recent rows' agreement in a row's
    prompt_recent_alpha: float = Field(0.05, gt=0.0, le=1.0)  # EMA constant per check of the recent rows' agreement
    prompt_odds_cap: float = Field(1.5, ge=0.0)  # ... and by at most this much either way
    text_slope: float = Field(1.0, ge=0.0)   # a pair's measured rates move by this times the log-odds between
                                        # the prompt agreement of the rows the pool runs now and of those
                                        # the pair ran (within prompt_odds_cap; 0: never)
    tail_weight: float = Field(1.0, ge=0.0)   # weight of the overshoot and the rows' finishing spread (0: T_eff only)
    batch_max_window: int = Field(6, ge=1)    # longest window for a batch of two rows or more, unless named
    context_alpha: float = 0.1          # EMA constant of forward times over the latency table's, per context length
    context_min_cycles: int = 5         # ... used once this many cycles measured it
    context_scale_range: tuple[float, float] = (0.5, 2.5)   # ... and kept within this range
    context_fade_alpha: float = 0.05    # a model's ratio over the target's fades towards 1 by this per cycle
                                        # it sits out


def candidate_chains(models: Sequence[str], target: str, max_levels: int) -> list[tuple[str, ...]]:
    """Every chain of distinct models ending at the target, shortest first."""
    others = [m for m in models if m != target]
    chains = []
    for n in range(0, min(len(others), max_levels - 1) + 1):
        chains += [(*p, target) for p in itertools.permutations(others, n)]
    return chains


def call_overhead(known: Mapping[tuple[str, int], float], model: str, forwards: int) -> float:
    """The router-side cost of a call to `model` beyond its `forwards` passes (round trip, sampling, ...),
    from the measured EMAs: the EMA of that many passes when there is one, else the
    line through the fewest and the most passes measured (never below 0), 0 when none is measured."""
    if (model, forwards) in known:
        return known[(model, forwards)]
    same = sorted((f, y) for (m, f), y in known.items() if m == model)
    if not same:
        return 0.0
    if len(same) == 1:
        return same[0][1]
    (f0, y0), (f1, y1) = same[0], same[-1]
    return max(0.0, y0 + (y1 - y0) * (forwards - f0) / (f1 - f0))


def chain_pairs(chain: Sequence[str]) -> list[tuple[str, str]]:
    return list(zip(chain[:-1], chain[1:]))


def batch_shift(rows: Sequence[Row], prior_checks: float, step: float, down: float, up: float) -> int:
    """The batch's acceptance against the pool's prediction, as a log-odds shift in whole `step`s.

    Over the rows' records: realized rate rho (shrunk by `prior_checks` per row towards the predicted rate pi),
    shift = logit(rho) - logit(pi), clipped to [-`down`, `up`]. 0 until the rows have a prediction to
    compare."""
    if step <= 0:
        return 0
    acc = tried = p_acc = p_tried = 0.0
    for r in rows:
        a, t, pa, pt = r.acceptance_record
        acc, tried, p_acc, p_tried = acc + a, tried + t, p_acc + pa, p_tried + pt
    if p_tried <= 0:
        return 0
    pi = p_acc / p_tried
    prior = prior_checks * len(rows)
    rho = (acc + prior * pi) / (tried + prior)
    shift = max(-down, min(up, logit(rho) - logit(pi)))
    return int(round(shift / step))


def _least(candidates: Sequence[Prediction], score: Score, scales: Mapping[str, float]) -> Prediction | None:
    """The candidate of least `score`, from candidates ordered by scaled T_eff, which `score` never goes
    below unless it says so (`bounded` False): once the next one's T_eff is no less than the best score
    found, none after it can beat it."""
    best, best_score = None, math.inf
    bounded = getattr(score, "bounded", True)
    for p in candidates:
        if best is not None and bounded and (score is _t_eff or p.scaled_cost_ns(scales) / p.emitted >= best_score):
            break
        value = score(p)
        if value < best_score:
            best, best_score = p, value
    return best


def _tokens_left(rows: Sequence[Row]) -> int:
    """The most tokens a row of the batch may still emit (max_new_tokens; a row may stop sooner)."""
    return max((_row_tokens_left(r) for r in rows), default=0)


def _row_tokens_left(row: Row) -> int:
    return row.max_new_tokens - (len(row.tokens) - row.prompt_len)


def _power_of_two(n: int) -> int:
    """n rounded up to a power of two."""
    return 1 << max(0, n - 1).bit_length()


def _lower_priority(nice: int) -> None:
    """Raises the calling thread's niceness by `nice` (Linux schedules threads, so this is the thread's
    own; elsewhere, or where the OS refuses, the thread runs as it was).

    The planner shares the machine with the model workers: on a small one their passes use every core,
    and a plan made meanwhile (a few ms of CPU) slows the pass it runs beside. At batch 4 and 16, where the
    tail's compositions and the shift variants keep about eight plans a second in use, adaptive's cycles
    cost 2-3% more than a static's at the same configuration and rows (README, run 19). A nice thread
    gets the cores the workers leave idle (between passes, while the drafter runs on one core), and the
    GIL it may hold is released after every chain (`_make_plan`'s pause)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:
        log.info("the scheduler's planner runs at the router's priority: %s", exc)


def context_bucket(rows: Sequence[Row]) -> int:
    """The batch's longest row (prompt and generated tokens), rounded up to a power of two."""
    return _power_of_two(max((len(r.tokens) for r in rows), default=1))


Score = Callable[[Prediction], float]
PlanKey = tuple[int, int, int, int, "frozenset[tuple[str, str]] | None"]


NO_SCALES: Mapping[str, float] = types.MappingProxyType({})   # every model as the latency table says
FINISH_HORIZON = 16   # tokens left up to which a one-row batch's finish is costed exactly


def _t_eff(p: Prediction) -> float:
    return p.t_eff_ns


class _Ema:
    __slots__ = ("alpha", "value", "weight", "count")

    def __init__(self, alpha: float):
        self.alpha, self.value, self.weight, self.count = alpha, 0.0, 0.0, 0

    def add(self, x: float) -> None:
        self.value = (1 - self.alpha) * self.value + self.alpha * x
        self.weight = (1 - self.alpha) * self.weight + self.alpha
        self.count += 1

    def fade(self, towards: float, rate: float) -> None:
        """Moves the estimate `rate` of the way to `towards` (no sample, so the count stays)."""
        if self.weight > 0:
            self.value = (self.get() + rate * (towards - self.get())) * self.weight

    def get(self, default: float = 0.0) -> float:
        return self.value / self.weight if self.weight > 0 else default


@dataclass
class Plan:
    """The ranked candidates for one batch composition."""

    predictions: list[Prediction]
    by_key: dict[tuple[tuple[str, ...], int], Prediction]
    estimates: AcceptanceEstimates
    latency: LatencyTable
    made_at: float
    version: int
    finish: Finish | None = None   # for a one-row composition, made with the plan


@dataclass(frozen=True)
class Finish:
    """A one-row plan's finish costs at the latency table's own times: the least T_eff (`rate`) and, per
    candidate (by id), finish_regret less the cycle's cost for every number of tokens left up to `reach`."""

    rate: float
    excess: dict[int, list[float]]

    @classmethod
    def of(cls, predictions: Sequence[Prediction], horizon: int, reach: int) -> Finish:
        rate = min(p.t_eff_ns for p in predictions)
        best = best_finish(predictions, [p.cost_ns for p in predictions], horizon)
        table = finish_excess(predictions, best, rate, reach).tolist()
        return cls(rate, {id(p): row for p, row in zip(predictions, table)})


@dataclass
class Decision:
    chain: tuple[str, ...]
    window: int
    prediction: Prediction | None     # None: a named chain the scheduler does not plan
    base: Prediction | None = None    # the same candidate under the pool's acceptance (no batch shift)


@dataclass
class _BatchState:
    current: Decision | None = None   # the standing choice (explorations do not replace it)
    last: Decision | None = None      # the decision of the latest cycle, exploration or not
    cycles: int = 0


@dataclass
class Ledger:
    """Cumulative measured and predicted figures, for the report (diff two reads to get a run's)."""

    cycles: int = 0
    cycle_ns: int = 0
    emitted: float = 0.0                 # mean tokens emitted per row, summed over cycles
    predicted_cycle_ns: float = 0.0
    predicted_emitted: float = 0.0
    pairs: dict[Pair, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0, 0.0, 0.0]))
    # pair -> [realized accepted, realized checked, predicted accepted, predicted checked]


class Scheduler:
    def __init__(self, models: Sequence[str], target: str, settings: SchedulerSettings | None = None,
                 snapshot: Callable[[], ppb.SnapshotResponse | None] = lambda: None,
                 warmup: Mapping[str, Sequence[tuple[int, int, int]]] | None = None,
                 offline_similarity: Sequence[PairSimilarity] = (), clock: Callable[[], float] = time.monotonic):
        self.settings = settings or SchedulerSettings()
        self.target = target
        self.models = list(models)
        self.chains = candidate_chains(models, target, self.settings.max_levels)
        self.pairs = sorted({p for c in self.chains for p in chain_pairs(c)})
        self._snapshot = snapshot
        self._warmup = dict(warmup or {})
        self._offline = list(offline_similarity)
        self._clock = clock
        # (greedy, sampling, prompt shift of every pair, record shift, pairs it shifts) -> plan
        self._plans: dict[PlanKey, Plan] = {}
        self._batches: weakref.WeakKeyDictionary[ChainBatch, _BatchState] = weakref.WeakKeyDictionary()
        self._version = 0
        self._inputs: tuple[int, AcceptanceEstimates, LatencyTable] | None = None   # of snapshot version
        self._last_snapshot_id = None
        self._pair_seen_at: dict[Pair, float] = {}
        self._pair_checks: dict[Pair, int] = {}
        self._recent = RecentReports(self.settings.recent_cycles)
        self._shares: dict[tuple[Pair, int], float] = {}
        # per pair: the pool's prompt agreement, an EMA over the checks at position 0 of the rows that ran
        # it with the profiler's acceptance constant (taken from the snapshot), and the recent rows'
        self._acceptance_alpha = EmaConstants.acceptance_alpha
        self._prompt_ref: dict[Pair, _Ema] = defaultdict(lambda: _Ema(self._acceptance_alpha))
        self._prompt_recent: dict[Pair, _Ema] = defaultdict(lambda: _Ema(self.settings.prompt_recent_alpha))
        # ... and the agreement of every row the pool runs, whichever chain: the text it serves now
        self._prompt_text: dict[Pair, _Ema] = defaultdict(lambda: _Ema(self._acceptance_alpha))
        alpha = self.settings.overhead_alpha
        # (model, batch size rounded up to a power of two, passes) -> the call's wall time beyond its passes
        self._call_overhead: dict[tuple[str, int, int], _Ema] = defaultdict(lambda: _Ema(alpha))
        self._cycle_overhead: dict[int, _Ema] = defaultdict(lambda: _Ema(alpha))
        # (model, context bucket) -> the target's passes over the table's; every other model's over the target's
        self._context_scale: dict[tuple[str, int], _Ema] = defaultdict(lambda: _Ema(self.settings.context_alpha))
        self.lock = threading.RLock()   # plans made inline (under the lock) read the overheads too
        self.decision_ns = _Ema(0.01)
        self.cycle_ns = _Ema(0.01)
        # stand_ins: rankings asked for a shift not planned yet, served by the nearest planned one
        self.counts = {"decisions": 0, "explorations": 0, "switches": 0, "plans": 0, "stand_ins": 0}
        self.planning_ns = 0                      # time spent planning, all threads
        self._cycles = 0                          # decisions of every batch, for the exploration rate
        self._last_explore_cycle = -(10**9)
        self._wanted: dict[PlanKey, float] = {}   # plan key -> last time a decision needed it
        self._finish_reach = FINISH_HORIZON + max(self.settings.windows) + 1   # tokens left a finish is costed to
        self._stop = threading.Event()
        self._wake = threading.Event()   # a decision asked for a plan the planner has not made
        self._planner: threading.Thread | None = None
        self.ledgers: dict[tuple[tuple[str, ...], int, int, bool], Ledger] = defaultdict(Ledger)

    # -- inputs -------------------------------------------------------------------------------------

    def cycle_overhead(self, batch_size: int) -> float:
        with self.lock:
            known = self._cycle_overhead.get(batch_size)
            if known is not None and known.weight > 0:
                return known.get()
            near = [(abs(b - batch_size), e.get()) for b, e in self._cycle_overhead.items() if e.weight > 0]
        return min(near)[1] if near else 0.0

    def _call_overheads_at(self, batch_size: int) -> dict[tuple[str, int], float]:
        """Per (model, passes), the call overheads measured at the batch size (rounded up to a power of
        two: a wave's tail passes through every size below the full one, each seen a few times); for a
        model with none there, those of the nearest size it was measured at (on a log scale). A call's work
        beyond its passes (messages, sampling, the worker's bookkeeping) grows with its rows, and a wave's
        batch shrinks as rows finish: one EMA over every size priced a full batch at its tail's rows."""
        b = _power_of_two(batch_size)
        sizes: dict[str, dict[int, dict[int, float]]] = defaultdict(dict)
        for (model, size, passes), e in self._call_overhead.items():
            if e.weight > 0:
                sizes[model].setdefault(size, {})[passes] = e.get()
        known = {}
        for model, by_size in sizes.items():
            near = min(by_size, key=lambda size: (abs(math.log(size / b)), size))
            known.update({(model, passes): value for passes, value in by_size[near].items()})
        return known

    # -- plans --------------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the background planner (without it, stale plans are refreshed inline)."""
        self._planner = threading.Thread(target=self._plan_loop, name="scheduler-planner", daemon=True)
        self._planner.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def _plan_loop(self) -> None:
        """A round every `recompute_s`, or at once when a decision asks for a shift not planned yet: a
        one-row request lasts a few rounds, and its prompt's shift (known at its first cycle) would
        otherwise wait up to a round for its plan, the nearest shift's serving meanwhile."""
        _lower_priority(self.settings.planner_nice)
        while True:
            self._wake.wait(self.settings.recompute_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._refresh_plans()
            except Exception:   # noqa: BLE001 - a bad snapshot must not stop planning for good
                log.exception("the scheduler's planner failed; it tries again in %.2f s", self.settings.recompute_s)

    def _refresh_plans(self) -> None:
        """Remakes the stale plans that a decision asked for since they were made. A plan nobody asked for
        since is left as it is until one does (it serves that decision, and is remade by the next round):
        the compositions a wave's tail passes through are asked for once or twice a wave, and remaking every
        one of them every round takes CPU time from the workers on a small machine. Plans not made yet
        come first: a stand-in serves those, a stale plan its own key."""
        now = self._clock()
        for key, used_at in sorted(self._wanted.items(), key=lambda kv: kv[0] in self._plans):
            if now - used_at > 10 * self.settings.recompute_s + 5:
                self._wanted.pop(key, None)
                continue
            plan = self._plans.get(key)
            if plan is not None and used_at <= plan.made_at:
                continue
            if plan is None or self._stale(plan):
                fresh = self._make_plan(*key, pause=True)
                with self.lock:
                    self._plans[key] = fresh

    def _refresh_snapshot(self) -> ppb.SnapshotResponse | None:
        snapshot = self._snapshot()
        if snapshot is not None and id(snapshot) != self._last_snapshot_id:
            self._last_snapshot_id = id(snapshot)
            self._version += 1
            self._note_snapshot(snapshot, self._clock())
        return snapshot

    def _stale(self, plan: Plan) -> bool:
        self._refresh_snapshot()
        return plan.version != self._version and self._clock() - plan.made_at >= self.settings.recompute_s

    def _servable(self, plan: Plan, now: float) -> bool:
        """Whether a plan the planner has not remade may serve a decision: younger than `plan_max_age_s`,
        or made from the latest snapshot. The planner remakes the plans in use each round, but a plan
        asked for once in a while (the first cycles of a request, a shift its rows reach now and then) was
        served as it stood and remade after. On a stream that changes kind, with other requests run between
        two adaptive ones (the report's run-offs), a third of the decisions were served by plans over 1 s
        old from a replaced snapshot, up to 291 s old: rankings of the text before."""
        if now - plan.made_at < self.settings.plan_max_age_s:
            return True
        try:
            self._refresh_snapshot()
        except Exception:   # noqa: BLE001 - no snapshot to replan from: what stands serves
            log.debug("no profiler snapshot to replan from", exc_info=True)
            return True
        return plan.version == self._version

    @staticmethod
    def composition(greedy_rows: int, sampling_rows: int) -> tuple[int, int]:
        """Batch compositions planned alike: the profiler's buckets (exact up to 16, then powers of two)."""
        return (bucket(greedy_rows) if greedy_rows else 0), (bucket(sampling_rows) if sampling_rows else 0)

    def plan(self, greedy_rows: int, sampling_rows: int, shift: int = 0,
             pairs: frozenset[tuple[str, str]] | None = None, common: int = 0) -> Plan:
        """The ranking for a batch composition (with the acceptance of every pair shifted by `common` steps,
        and of `pairs`, every pair if None, by `shift` more): the standing plan, made now if there is none
        (or it is stale and no planner thread runs, or too old to serve: `_servable`). A shift the planner
        thread has not planned yet (or whose plan is too old) is left to it; the nearest servable planned
        shift serves meanwhile, and with none the plan is made now."""
        key: PlanKey = (*self.composition(greedy_rows, sampling_rows), common, shift, pairs if shift else None)
        now = self._wanted[key] = self._clock()
        plan = self._plans.get(key)
        planner_running = self._planner is not None and self._planner.is_alive()
        if plan is not None and planner_running and not self._servable(plan, now):
            plan = None
        if plan is None and (shift or common) and planner_running:
            near = [k for k, p in self._plans.items()
                    if k[:2] == key[:2] and k[4] in (key[4], None) and self._servable(p, now)]
            if near:
                self.counts["stand_ins"] += 1
                self._wake.set()
                return self._plans[min(near, key=lambda k: abs(k[2] - common) + abs(k[3] - shift))]
        if plan is None or (not planner_running and self._stale(plan)):
            plan = self._plans[key] = self._make_plan(*key)
        return plan

    def _make_plan(self, greedy_rows: int, sampling_rows: int, common: int = 0, shift: int = 0,
                   pairs: frozenset[tuple[str, str]] | None = None, pause: bool = False) -> Plan:
        """The ranking for one composition, the acceptance rates of every pair shifted by `common` steps of
        log-odds and those of `pairs` (every pair if None) by `shift` more. With
        `pause` (the planner thread), the GIL is offered after every chain, so that the cycle thread
        waiting on a worker's reply gets it at once, not after the interpreter's switch interval."""
        started = time.perf_counter_ns()
        now = self._clock()
        snapshot = self._refresh_snapshot()
        version = self._version
        s = self.settings
        inputs = self._inputs
        if inputs is None or inputs[0] != version:   # one snapshot's estimates serve every composition
            inputs = self._inputs = (version, AcceptanceEstimates(snapshot, self._offline, s.prior_weight,
                                                                  s.default_acceptance, self._shares,
                                                                  self.text_shifts()),
                                     latency_table(snapshot, self._warmup))
        _, estimates, latency = inputs
        batch = greedy_rows + sampling_rows
        step = s.batch_odds_step
        cycle_overhead = self.cycle_overhead(batch)
        with self.lock:   # a copy: cycles add to the EMAs while this plan is made
            known = self._call_overheads_at(batch)
        overhead = functools.partial(call_overhead, known)
        predictions = []
        for chain in self.chains:
            if not all(m in latency.models() for m in chain):
                continue
            depth = max(s.windows) + len(chain)
            windows = s.windows if len(chain) > 1 else [0]
            groups_rates = {mode: [estimates.rates((d, v, mode), depth) for d, v in chain_pairs(chain)]
                            for mode, n in ((GREEDY, greedy_rows), (SAMPLING, sampling_rows)) if n}
            if shift or common:
                moved = [step * (common + (shift if pairs is None or pair in pairs else 0))
                         for pair in chain_pairs(chain)]
                groups_rates = {mode: [[shifted(a, odds) for a in rates] if odds else rates
                                       for rates, odds in zip(per_pair, moved)]
                                for mode, per_pair in groups_rates.items()}
            groups = [RowGroup(n, groups_rates[mode]) for mode, n in ((GREEDY, greedy_rows), (SAMPLING, sampling_rows))
                      if n]
            for w in windows:
                predictions.append(predict(chain, w, groups, latency, overhead, cycle_overhead))
            if pause:
                time.sleep(0)
        predictions.sort(key=lambda p: p.t_eff_ns)
        finish = Finish.of(predictions, FINISH_HORIZON, self._finish_reach) if batch == 1 and predictions else None
        self.counts["plans"] += 1
        self.planning_ns += time.perf_counter_ns() - started
        return Plan(predictions, {(p.chain, p.window): p for p in predictions}, estimates, latency, now, version,
                    finish)

    def _note_snapshot(self, snapshot: ppb.SnapshotResponse, now: float) -> None:
        """A pair whose checks grew since the last snapshot was measured (by any router)."""
        self._recent.update(snapshot)
        self._shares = self._recent.shares()
        if snapshot.acceptance_alpha > 0:
            self._acceptance_alpha = snapshot.acceptance_alpha
        for a in snapshot.acceptance:
            if a.position != 0:
                continue
            pair = (a.drafter, a.verifier, GREEDY if a.mode == ppb.DECODING_MODE_GREEDY else SAMPLING)
            if a.proposed_total > self._pair_checks.get(pair, 0):
                self._pair_checks[pair] = a.proposed_total
                self._pair_seen_at[pair] = max(self._pair_seen_at.get(pair, -math.inf), now)

    # -- decisions ----------------------------------------------------------------------------------

    def choose(self, batch: ChainBatch, chain: Sequence[str] | None = None, window: int = 0,
               ) -> tuple[tuple[str, ...], int]:
        """The (chain, window) of the batch's next cycle. A `chain` or a `window` the requests named narrows
        the choice to the candidates that have it (no exploration then)."""
        started = time.perf_counter_ns()
        with self.lock:
            state = self._batches.setdefault(batch, _BatchState())
            state.last = decision = self._decide(batch, state, tuple(chain) if chain else None, window)
        self.decision_ns.add(time.perf_counter_ns() - started)
        return decision.chain, decision.window

    def decision_for(self, batch: ChainBatch) -> Decision | None:
        """The decision of the batch's latest cycle."""
        state = self._batches.get(batch)
        return state.last if state else None

    def _decide(self, batch: ChainBatch, state: _BatchState, chain: tuple[str, ...] | None, window: int) -> Decision:
        s = self.settings
        rows = [r for r in batch.rows.values() if r.finish_reason is None]
        greedy = sum(1 for r in rows if r.sampling.greedy)
        common = self._prompt_shift(rows)
        base = plan = self.plan(greedy, len(rows) - greedy, common=common)
        shift = batch_shift(rows, s.row_prior_checks, s.batch_odds_step, s.batch_odds_down, s.batch_odds_up)
        # the rows' record is of the pairs they ran, the standing chain's: rows that draft better than
        # predicted move those pairs alone (what one drafter finds easy another may not), rows that
        # draft worse move every pair (text hard for one drafter is hard for the others), so that the
        # record never makes a chain it did not measure look better than the one it did
        pairs = frozenset(chain_pairs(state.current.chain)) if state.current is not None and shift > 0 else None
        if shift:
            plan = self.plan(greedy, len(rows) - greedy, shift, pairs, common)
        scales = self._latency_scales(rows)
        score: Score = _t_eff
        solo = None
        if s.tail_weight > 0 and rows:   # with the same cycles for one row of the batch's main mode
            main = 2 * greedy >= len(rows)
            solo = plan if len(rows) == 1 else self.plan(1 if main else 0, 0 if main else 1, shift, pairs, common)
        if solo is not None or scales:
            score = self._score(rows, scales, solo)
        workers = getattr(batch, "workers", None)   # the models the batch still has (one may have failed)
        usable = None if workers is None or set(self.models) <= set(workers) else frozenset(workers)
        decision = self._decide_in(plan, state, rows, greedy, chain, window, score, scales, usable)
        if decision.prediction is not None and scales:
            decision.prediction = decision.prediction.scaled(scales)
        decision.base = base.by_key.get((decision.chain, decision.window))
        return decision

    def _prompt_shift(self, rows: Sequence[Row]) -> int:
        """The batch's acceptance shift from its rows' prompts, in whole `batch_odds_step`s.

        Per row and pair: its models' agreement on the prompt, a (shrunk by `prompt_prior_positions`
        towards the recent rows' agreement), against the pool's agreement b: `prompt_slope` *
        (logit(a) - logit(b)), averaged over the pairs by their share of the pool's recent cycles, then
        over the rows (a row without an agreement counts 0), within `prompt_odds_cap` either way. b is an EMA over the same checks as the
        profiler's acceptance, so the shift says how this batch differs from the rows the pool's rates
        describe, and fades as those rates catch up with a new kind of text."""
        s = self.settings
        if s.prompt_slope <= 0 or s.batch_odds_step <= 0 or not rows:
            return 0
        total = 0.0
        for r in rows:
            if not r.prompt_agreement:
                continue
            mode = GREEDY if r.sampling.greedy else SAMPLING
            num = den = 0.0
            for d, v in self.pairs:
                hit = r.prompt_agreement.get((d, v))
                pool = self.prompt_reference((d, v, mode))
                weight = self._shares.get(((d, v, mode), 0), 0.0)
                if hit is None or pool is None or weight <= 0:
                    continue
                recent = self._prompt_recent.get((d, v, mode))
                prior = recent.get(pool) if recent is not None else pool
                same, n = hit
                rate = (same + s.prompt_prior_positions * prior) / (n + s.prompt_prior_positions)
                num += weight * (logit(rate) - logit(pool))
                den += weight
            if den > 0:
                total += num / den
        shift = max(-s.prompt_odds_cap, min(s.prompt_odds_cap, s.prompt_slope * total / len(rows)))
        return int(round(shift / s.batch_odds_step))

    def prompt_reference(self, pair: Pair) -> float | None:
        """The pool's prompt agreement for `pair` (drafter, verifier, mode), None before any row ran it."""
        ref = self._prompt_ref.get(pair)
        return ref.get() if ref is not None and ref.weight > 0 else None

    def text_shifts(self) -> dict[Pair, float]:
        """Per pair, the log-odds its measured rates move by to describe the text the pool runs now:
        `text_slope` times logit(agreement of the rows the pool runs now) - logit(agreement of the rows
        the pair's rates were measured on), within `prompt_odds_cap`; 0 where either is unknown.

        The profiler's rates of a pair are of the text the pair last ran on, and a pair the batches
        stopped running keeps them while the text changes: on the switching stream (report, batch 1) 5m ->
        29m held the rates of the tables it last ran on, 0.81-0.90 at position 0, through the first prose
        requests while 1m -> 29m, running, fell from 0.89 to 0.72, and six of those requests ran on 5m at
        windows 2-5, at 0.82 of the fastest static's speed (geometric mean; 0.64-1.12). Both agreements
        are EMAs over the same kind of count, one per row and cycle (the pool's over every cycle that
        drafted, the pair's over those that checked it), so for the pair in use they are one and its
        rates stay as measured. Cycles of the target alone are left out of both: in the report a
        target-only request runs 48 cycles against 10-20 for a chain, and counted in the pool's alone
        they would weigh the latest prompts more there than in the pair's, and shift the pair in use."""
        slope, cap = self.settings.text_slope, self.settings.prompt_odds_cap
        if slope <= 0:
            return {}
        out = {}
        for pair, ref in list(self._prompt_ref.items()):
            now = self._prompt_text.get(pair)
            if ref.weight > 0 and now is not None and now.weight > 0:
                out[pair] = max(-cap, min(cap, slope * (logit(now.get()) - logit(ref.get()))))
        return out

    def _observe_prompts(self, report: CycleReport, rows: Sequence[Row]) -> None:
        """The pool's prompt agreement per pair: each row's, once per check at position 0 it ran; and the
        text the pool drafts on, every row's once per cycle it drafted in, for every pair (so that for the
        pair the pool runs the two are one EMA; a cycle of the target alone moves neither)."""
        for r_index, r in enumerate(rows):
            if not any(counts[r_index] for counts in report.proposed.values()):
                continue
            mode = GREEDY if r.sampling.greedy else SAMPLING
            for d, v in self.pairs:
                hit = r.prompt_agreement.get((d, v))
                if hit is not None and hit[1]:
                    text = self._prompt_text[(d, v, mode)]
                    text.alpha = self._acceptance_alpha
                    text.add(hit[0] / hit[1])
        for d, v in chain_pairs(report.chain):
            for r_index, r in enumerate(rows):
                hit = r.prompt_agreement.get((d, v))
                if hit is None or not hit[1] or not report.proposed[v][r_index]:
                    continue
                pair = (d, v, GREEDY if r.sampling.greedy else SAMPLING)
                self._prompt_ref[pair].alpha = self._acceptance_alpha   # the snapshot's, which may change
                self._prompt_ref[pair].add(hit[0] / hit[1])
                self._prompt_recent[pair].add(hit[0] / hit[1])

    def _latency_scales(self, rows: Sequence[Row]) -> dict[str, float]:
        """Per model, its passes over the latency table's at the batch's context length: the target's as
        measured, another model's the target's times its own over the target's (1 until measured)."""
        context = context_bucket(rows)
        s = self.settings
        target = self._context_scale.get((self.target, context))
        if target is None or target.count < s.context_min_cycles:
            return {}
        low, high = s.context_scale_range
        scales = {}
        for model in self.models:
            own = self._context_scale.get((model, context)) if model != self.target else None
            relative = own.get() if own is not None and own.count >= s.context_min_cycles else 1.0
            scales[model] = min(high, max(low, target.get() * relative))
        return scales

    def _score(self, rows: Sequence[Row], scales: Mapping[str, float], solo: Plan | None) -> Score:
        """T_eff with the batch's latency scales, times the weighted cost of the rows' overshoot and spread
        (cost_model.tail_factor) when `solo` (the one-row plan) is given; for a batch of one row, its
        regret against the best finish (`_finish_score`)."""
        left = [_row_tokens_left(r) for r in rows]
        weight = self.settings.tail_weight
        memo: dict[int, float] = {}
        if solo is not None and len(rows) == 1 and left[0] > 0:
            return self._finish_score(solo, scales, left[0])

        def score(p: Prediction) -> float:
            hit = memo.get(id(p))
            if hit is None:
                cost = p.scaled_cost_ns(scales)
                hit = cost / p.emitted
                one = solo.by_key.get((p.chain, p.window)) if solo is not None else None
                if one is not None:
                    hit *= 1 + weight * (tail_factor(p, one.scaled_cost_ns(scales), left, cost) - 1)
                memo[id(p)] = hit
            return hit
        return score

    def _finish_score(self, plan: Plan, scales: Mapping[str, float], left: int) -> Score:
        """Score of a one-row batch with `left` tokens to emit: the best T_eff g plus a candidate's regret
        (cost_model.finish_regret: its cycle's cost beyond the best finish) per token it emits. Far from
        the end (more than FINISH_HORIZON tokens left after any cycle) that is exactly its T_eff; nearer,
        it counts the tokens emitted past the end and the cost of the few left, exactly for one row. The
        plan tables the regrets (less the cycle's cost) at the latency table's times (`Finish`, made with
        the plan, off the cycle's path); a batch whose passes run slower or faster (its latency scales)
        has them scaled by its best T_eff over the plan's, which leaves the score its T_eff where the
        table ends. The best candidate scores g, which may be below its T_eff: not `bounded` by T_eff."""
        if left > self._finish_reach or not plan.predictions:
            return lambda p: p.scaled_cost_ns(scales) / p.emitted
        finish = plan.finish
        if finish is None:   # a plan made for another batch size serving a one-row batch
            finish = plan.finish = Finish.of(plan.predictions, FINISH_HORIZON, self._finish_reach)
        costs = {id(p): p.scaled_cost_ns(scales) for p in plan.predictions} if scales else None
        stretch = (min(costs[id(p)] / p.emitted for p in plan.predictions) / finish.rate) if costs else 1.0
        rate, excess, weight = finish.rate * stretch, finish.excess, self.settings.tail_weight

        def score(p: Prediction) -> float:
            cost = costs.get(id(p)) if costs is not None else None
            if cost is None:
                cost = p.scaled_cost_ns(scales)
            t_eff = cost / p.emitted
            beyond = excess.get(id(p))
            if beyond is None:
                return t_eff
            return t_eff + weight * (rate + (cost + stretch * beyond[left]) / p.emitted - t_eff)
        score.bounded = False
        return score

    def _decide_in(self, plan: Plan, state: _BatchState, rows: Sequence[Row], greedy: int,
                   chain: tuple[str, ...] | None, window: int, score: Score = _t_eff,
                   scales: Mapping[str, float] = NO_SCALES, usable: frozenset[str] | None = None) -> Decision:
        """The decision among the plan's candidates that the requests left open, over the models in
        `usable` (None: every model of the pool)."""
        s = self.settings
        state.cycles += 1
        self._cycles += 1
        self.counts["decisions"] += 1
        predictions = plan.predictions if usable is None else [p for p in plan.predictions if usable >= set(p.chain)]
        named = [p for p in predictions if (chain is None or p.chain == chain)   # what the requests left us
                 and (not window or p.window == window or len(p.chain) == 1)]
        if not named:     # a chain longer than `max_levels` or a window beyond `windows`: unplanned
            fallback = chain or (predictions[0].chain if predictions else (self.target,))
            return Decision(fallback, window or s.windows[len(s.windows) // 2], None)
        # a draft longer than any row has tokens left to emit is drafted for nothing (a cycle emits at most
        # window + 1): the candidates that fit, unless the window was named; if none fits (a named chain with
        # one token left), every window emits that token alone and the cheapest cycle is the best
        room = min(_tokens_left(rows), s.batch_max_window + 1 if len(rows) > 1 else math.inf)
        candidates = named if window else ([p for p in named if len(p.chain) == 1 or p.window < room]
                                           or [min(named, key=lambda p: p.cost_ns)])
        if score is not _t_eff:   # by the bound, cheap to compute: the score is never below it
            candidates = sorted(candidates, key=lambda p: p.scaled_cost_ns(scales) / p.emitted)
        if chain is None and not window:
            explore = self._exploration(plan, state, rows, greedy, len(rows) - greedy, predictions)
            if explore is not None:
                self._last_explore_cycle = self._cycles
                self.counts["explorations"] += 1
                return explore
        state.current = decision = self._settle(plan, state.current, candidates, rows, chain is None, score, scales)
        return decision

    def _settle(self, plan: Plan, current: Decision | None, candidates: Sequence[Prediction], rows: Sequence[Row],
                chain_free: bool, score: Score = _t_eff, scales: Mapping[str, float] = NO_SCALES) -> Decision:
        """The hysteresis: the standing choice, its window moved or its chain switched only when worth it.
        `candidates`: the allowed predictions in increasing order of a lower bound of `score` (their scaled
        T_eff), so that the least score is found scoring only those whose bound is below it."""
        s = self.settings
        best = _least(candidates, score, scales)
        kept = None if current is None else plan.by_key.get((current.chain, current.window))
        same = None if kept is None else _least([p for p in candidates if p.chain == kept.chain], score, scales)
        if kept is None or same is None:   # nothing standing, or its chain is not allowed any more
            if current is not None and (current.chain, current.window) != (best.chain, best.window):
                self.counts["switches"] += 1
            return Decision(best.chain, best.window, best)
        # the standing chain at its best allowed window, if that is worth moving to (or kept no longer fits)
        allowed = any(p is kept for p in candidates)
        target = same if not allowed or score(same) < score(kept) * (1 - s.hysteresis) else kept
        if best.chain != kept.chain and chain_free:
            horizon = min(s.switch_horizon_cycles, max(1.0, _tokens_left(rows) / best.emitted))
            catch_up = self._catch_up_ns(plan, best.chain, rows, scales)
            best_t = score(best) * (1 + catch_up / horizon / best.scaled_cost_ns(scales))
            # dropping levels brings in no model that sat out: it is as cheap and as sure as a window change
            margin = s.chain_hysteresis if set(best.chain) - set(kept.chain) else s.hysteresis
            if best_t < score(target) * (1 - margin):
                target = best
        if target is not kept:
            self.counts["switches"] += 1
        return Decision(target.chain, target.window, target)

    def _exploration(self, plan: Plan, state: _BatchState, rows: Sequence[Row], greedy: int,
                     sampling: int, predictions: Sequence[Prediction] | None = None) -> Decision | None:
        """An exploration cycle for the most overdue pair, in the best of `predictions` (by default the
        plan's) that holds it; None when no pair is due."""
        s = self.settings
        predictions = plan.predictions if predictions is None else predictions
        if self._cycles - self._last_explore_cycle < s.explore_every_cycles or len(self.chains) < 2:
            return None
        now = self._clock()
        modes = [m for m, n in ((GREEDY, greedy), (SAMPLING, sampling)) if n]
        stale = []
        for d, v in self.pairs:
            wait = self._exploration_wait(plan, (d, v))
            for mode in modes:
                age = now - self._pair_seen_at.get((d, v, mode), -math.inf)
                if age >= wait:
                    stale.append((age / max(wait, 1e-9), (d, v, mode)))
        # the most overdue first, in the best-ranked chain that holds it, at its window + extra; a chain whose
        # models missed tokens of the rows must feed them first (the catch-up), which can cost more than the
        # exploration cycle itself (on the demo pool at batch 1, exploration cycles ran 56-83 ms on a
        # request's first cycle and 140-240 ms some 30-40 tokens in), so it waits for a batch with none, up
        # to `explore_patience` times overdue
        for overdue, (d, v, mode) in sorted(stale, reverse=True):
            p = next((p for p in predictions if (d, v) in chain_pairs(p.chain)), None)
            if p is None or (overdue < s.explore_patience and self._catch_up_ns(plan, p.chain, rows) > 0):
                continue
            window = min(max(s.windows), p.window + s.explore_extra_window)
            prediction = plan.by_key.get((p.chain, window), p)
            self._pair_seen_at[(d, v, mode)] = now   # asked for; the snapshot confirms it later
            return Decision(p.chain, window, prediction)
        return None

    def _exploration_wait(self, plan: Plan, pair: tuple[str, str]) -> float:
        """How long a pair may go unmeasured. An exploration cycle costs a cycle of a slower chain and the
        catch-up of the models that sat out (at batch 1, a prefill of the whole row by a model that never
        saw it); what it buys is a fresh estimate, worth something only if the pair's chains could become
        the best. So a pair whose best chain is predicted g slower than the best waits `explore_after_s`
        times g / `explore_gap` (at least `explore_after_s`, at most `explore_after_max_s`)."""
        s = self.settings
        if s.explore_gap <= 0:
            return s.explore_after_s
        best = plan.predictions[0].t_eff_ns
        gap = next((p.t_eff_ns / best - 1 for p in plan.predictions if pair in chain_pairs(p.chain)), math.inf)
        return min(max(s.explore_after_s, s.explore_after_max_s), s.explore_after_s * max(1.0, gap / s.explore_gap))

    def _catch_up_ns(self, plan: Plan, chain: Sequence[str], rows: Sequence[Row],
                     scales: Mapping[str, float] = NO_SCALES) -> float:
        """Extra cost of the models in `chain` that must first feed the tokens they missed."""
        extra = 0.0
        for model in chain:
            lag = max((len(r.tokens) - r.seen.get(model, len(r.tokens)) for r in rows), default=0)
            if lag > 2:
                scale = scales.get(model, 1.0)
                extra += scale * (plan.latency(model, len(rows), lag) - plan.latency(model, len(rows), 1))
        return max(extra, 0.0)

    # -- measurements ---------------------------------------------------------------------------------

    def _observe_latency(self, report: CycleReport, rows: Sequence[Row]) -> None:
        """Each model's passes this cycle over what the latency table in use predicts for them."""
        table = self._inputs[2] if self._inputs is not None else None
        if table is None or not rows:
            return
        context = context_bucket(rows)
        ratios = {}
        for model, result in report.results.items():
            measured = predicted = 0.0
            for t in result.timings:
                if t.forward_ns > 0 and model in table.models():
                    measured += t.forward_ns
                    predicted += table(model, t.batch_size, t.tokens_per_row)
            if measured > 0 and predicted > 0:
                ratios[model] = measured / predicted
        target = ratios.get(self.target)
        if target is None:
            return
        self._context_scale[(self.target, context)].add(target)
        for model in self.models:
            if model == self.target:
                continue
            if model in ratios:
                self._context_scale[(model, context)].add(ratios[model] / target)
            elif (model, context) in self._context_scale:
                self._context_scale[(model, context)].fade(1.0, self.settings.context_fade_alpha)

    def observe(self, report: CycleReport, rows: Sequence[Row], cycle_ns: int, auto: bool,
                decision: Decision | None = None) -> None:
        """One finished cycle: the router's own costs, its passes against the latency table, and the
        measured against the predicted figures."""
        with self.lock:
            self._observe_latency(report, rows)
            self._observe_prompts(report, rows)
            calls = 0
            for model, result in report.results.items():
                wall = report.call_ns.get(model, 0)
                calls += wall
                if wall:
                    self._call_overhead[(model, _power_of_two(len(rows)), len(result.timings))].add(
                        max(0, wall - result.forward_ns))
            batch = len(rows)
            self._cycle_overhead[batch].add(max(0, cycle_ns - calls))
            self.cycle_ns.add(cycle_ns)
            now = self._clock()
            ledger = self.ledgers[(report.chain, report.window if len(report.chain) > 1 else 0, batch, auto)]
            ledger.cycles += 1
            ledger.cycle_ns += cycle_ns
            ledger.emitted += sum(len(report.emitted[r.row_id]) for r in rows) / batch
            # each row's drafts against the pool's prediction; the record ages every cycle, drafted or
            # not, so that a row that went to target-only on a bad streak drifts back to the pool's rate
            # (its record would otherwise stand still and keep it there)
            base = decision.base if decision is not None else None
            keep = self.settings.row_memory
            levels = list(enumerate(chain_pairs(report.chain)[: len(base.checks)])) if base is not None else []
            for r_index, r in enumerate(rows):
                record = r.acceptance_record
                record[:] = [x * keep for x in record]
                for level, (_, v) in levels:
                    acc = report.accepted[v][r_index]
                    record[0] += acc
                    record[1] += min(acc + 1, report.proposed[v][r_index])
                    record[2] += base.checks[level][0]
                    record[3] += base.checks[level][1]
            if decision is not None and decision.prediction is None:
                decision = None
            if decision is not None:
                ledger.predicted_cycle_ns += decision.prediction.cost_ns
                ledger.predicted_emitted += decision.prediction.emitted
            for level, (d, v) in enumerate(chain_pairs(report.chain)):
                modes = [GREEDY if r.sampling.greedy else SAMPLING for r in rows]
                for mode in set(modes):
                    self._pair_seen_at[(d, v, mode)] = now
                for r_index, mode in enumerate(modes):
                    acc = report.accepted[v][r_index]
                    tried = min(acc + 1, report.proposed[v][r_index])
                    entry = ledger.pairs[(d, v, mode)]
                    entry[0] += acc
                    entry[1] += tried
                    if decision is not None and level < len(decision.prediction.checks):
                        exp_acc, exp_tried = decision.prediction.checks[level]
                        entry[2] += exp_acc
                        entry[3] += exp_tried
