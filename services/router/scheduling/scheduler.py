"""The adaptive chain scheduler: per batch and per cycle, the (chain, window) of least predicted cost.

A thin front over the package's parts, each in its own module and each importing only those before it:

- candidates: the chains of the pool ending at the target, and the pairs their levels check;
- cycle_cost: one cycle's expected cost and emitted tokens; finish: a row's last cycles;
- latency: forward times fitted from the profiler's snapshot and the workers' warm-up;
- acceptance: each pair's acceptance per draft position, and the calibrated prior;
- the learned corrections, each an object with `observe` and `value`: the router's own costs
  (overheads), forward times per context length (context_scales), the rows' prompts
  (prompt_agreement), each row's record against its prediction (row_records), when each pair was
  last measured (freshness);
- plans: the ranked candidates per batch composition, and the planner thread that keeps them fresh;
- scoring and policy: a batch's score of each candidate, and the choice (fit, settle, explore);
- ledger: the cycles' measured and predicted figures, for the report.

A batch is planned with the pool's acceptance shifted by its rows' prompts (every pair, `common`
steps) and by its rows' own record: upwards, only the pairs its standing chain runs (the record is about
those: on repetitive text a batch's rows can beat the pool on the pair they run while another pair,
shifted alike, would be predicted far above what it realizes); downwards, every pair (rows hard for one
drafter are hard for the others: shifting the standing chain's pairs alone made chains the rows never
ran look better).
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from specrouter.pool.similarity import PairSimilarity
from specrouter.router.chain import ChainBatch
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.scheduling.acceptance import AcceptanceEstimates, RecentReports
from specrouter.contract.measures import Mode, bucket
from specrouter.router.scheduling.candidates import Pair, candidate_chains, chain_pairs, mode_of
from specrouter.router.scheduling.context_scales import ContextScales
from specrouter.router.scheduling.draft_passes import DraftPasses
from specrouter.router.scheduling.ema import Ema
from specrouter.router.scheduling.freshness import PairFreshness
from specrouter.router.scheduling.ledger import Ledgers
from specrouter.router.scheduling.overheads import CallOverheads, CycleOverheads
from specrouter.router.scheduling.plans import Matches, Plan, Planner
from specrouter.router.scheduling.policy import BatchState, Decision, Policy
from specrouter.router.scheduling.prompt_agreement import PromptAgreement
from specrouter.router.scheduling.row_records import RowRecords
from specrouter.router.scheduling.scoring import Score, batch_score, t_eff, tokens_left
from specrouter.router.scheduling.settings import SchedulerSettings
from specrouter.router.scheduling.snapshot import Snapshot


MATCH_GRAIN = 2   # a batch's rows' matches are priced in this many parts of it (`coarse_matches`)


def coarse_matches(matches: Sequence[int], parts: int) -> list[int]:
    """The rows' match lengths with each length's share of the batch rounded to whole parts of it (the
    largest remainders rounded up): a batch has a new mix of matches nearly every cycle, and where the
    models run in the router a plan is made on the cycle's path for each mix; in halves of the batch a few
    plans serve (at batch 4, exact mixes made choosing about 1.5 ms a cycle dearer, halves 0.8-1.1 ms)."""
    n = len(matches)
    counts = Counter(matches)
    exact = {m: c * parts / n for m, c in counts.items()}
    whole = {m: int(x) for m, x in exact.items()}
    for m in sorted(exact, key=lambda m: (whole[m] - exact[m], m))[:parts - sum(whole.values())]:
        whole[m] += 1
    out = [m for m in sorted(whole) for _ in range(whole[m] * n // parts)]
    return out + [max(whole, key=lambda m: (whole[m], m))] * (n - len(out))


def _size_class(rows: int) -> int:
    """A number of rows in half octaves (1, 2, 3, 4, 5-6, 7-9, 10-13, 14-19, ...; -1 for none): a batch of 16
    whose finished row's successor joins a cycle later is the same batch to a standing decision, one of 4
    that loses a row is not."""
    return -1 if rows <= 0 else round(2 * math.log2(rows))


class Scheduler:
    def __init__(self, models: Sequence[str], target: str, settings: SchedulerSettings | None = None,
                 snapshot: Callable[[], Snapshot | None] = lambda: None,
                 warmup: Mapping[str, Sequence[tuple[int, int, int]]] | None = None,
                 offline_similarity: Sequence[PairSimilarity] = (), clock: Callable[[], float] = time.monotonic,
                 levels: Sequence[str] = ()):
        """`levels`: drafters that run no model (the lookup), planned at the front of every chain that has
        room for one more level."""
        s = self.settings = settings or SchedulerSettings()
        self.target = target
        self.models = list(models)
        self.levels = list(levels)
        self.chains = candidate_chains(models, target, s.max_levels, levels, s.growing_chains)
        self.pairs = sorted({p for c in self.chains for p in chain_pairs(c)})
        self._offline = list(offline_similarity)
        self._clock = clock
        self.lock = threading.RLock()   # plans made inline (under the lock) read the overheads too
        self.decision_ns = Ema(0.01)
        self.cycle_ns = Ema(0.01)
        self.counts = {"decisions": 0, "explorations": 0, "switches": 0, "plans": 0, "stand_ins": 0}
        # the learned corrections
        self.call_overheads = CallOverheads(s.overhead_alpha)
        self.cycle_overheads = CycleOverheads(s.overhead_alpha)
        self.draft_passes = DraftPasses(s.overhead_alpha)
        self.context_scales = ContextScales(self.models, target, s)
        self.prompts = PromptAgreement(self.pairs, s)
        self.records = RowRecords(s)
        self.freshness = PairFreshness()
        self._recent = RecentReports(s.recent_cycles)
        self._shares: dict[tuple[Pair, int], float] = {}
        self.ledgers = Ledgers()
        self.planner = Planner(self.chains, s, snapshot, self._note_snapshot, self._estimates, warmup or {},
                               self._overheads, self.lock, clock, self.counts, free=self.levels)
        self.policy = Policy(s, target, self.chains, self.pairs, self.freshness, clock, self.counts, self.levels)
        self._batches: weakref.WeakKeyDictionary[ChainBatch, BatchState] = weakref.WeakKeyDictionary()

    @property
    def planning_ns(self) -> int:
        """Time spent planning, all threads."""
        return self.planner.planning_ns

    def start(self, passes_here: bool = False) -> None:
        """Starts the background planner, unless planning stays on the cycle's thread: where the settings
        say so, or, by default, where the models' passes run on this machine's cores (`passes_here`: the
        router holds the models, or a worker on the CPU answers on this host). A planning thread there runs
        beside the passes. In this process it takes the interpreter lock from the thread that drives them,
        between their operations; beside a worker it takes a core from the worker's OpenMP team, whose
        every operation then waits for the thread that lost its core (docs/scheduler.md). Inline, a decision
        that finds its plan stale remakes it, between the passes."""
        thread = self.settings.planner_thread
        if thread if thread is not None else not passes_here:
            self.planner.start()

    def close(self) -> None:
        self.planner.close()

    def plan(self, greedy_rows: int, sampling_rows: int, shift: int = 0,
             pairs: frozenset[tuple[str, str]] | None = None, common: int = 0, coupled_rows: int = 0,
             match: Matches = None) -> Plan:
        """The ranking for a batch composition, its pairs' acceptance shifted (Planner.plan)."""
        return self.planner.plan(greedy_rows, sampling_rows, shift, pairs, common, coupled_rows, match)

    def _match(self, batch: ChainBatch, rows: Sequence[Row]) -> Matches:
        """The lookup's matches the batch's next cycle is priced at, where the pool has the lookup: a lone
        row's match length; for rows of one decoding mode (in a batch planned at its own size), every row's,
        sorted (in halves of the batch above two rows: `coarse_matches`), or the one length they share.
        Otherwise None: the lookup priced over every match.

        The lookup's estimate over every match is carried by the rows that match, while a row without a
        match hands up one token whatever the others copy: priced at it, a batch whose rows mostly had
        nothing to copy was predicted to emit half as much again as it did."""
        if not self.levels or not rows:
            return None
        lookup_match = getattr(batch, "lookup_match", None)
        if lookup_match is None:
            return None
        if len(rows) > 1 and (len({mode_of(r) for r in rows}) > 1 or bucket(len(rows)) != len(rows)):
            return None
        matches = [lookup_match(r) for r in rows]
        if None in matches:   # no lookup level in the batch's pool
            return None
        if len(rows) > MATCH_GRAIN:
            matches = coarse_matches(matches, MATCH_GRAIN)
        matches.sort()
        return matches[0] if matches[0] == matches[-1] else tuple(matches)

    def _note_snapshot(self, snapshot: Snapshot, now: float) -> None:
        self._recent.update(snapshot)
        self._shares = self._recent.shares()
        self.prompts.note_snapshot(snapshot.acceptance_alpha, self._shares)
        self.freshness.note_snapshot(snapshot, now)

    def _estimates(self, snapshot: Snapshot | None) -> AcceptanceEstimates:
        s = self.settings
        return AcceptanceEstimates(snapshot, self._offline, s.prior_weight, s.default_acceptance, self._shares,
                                   self.prompts.text_shifts(), self.levels, s.lookup_prior)

    def _overheads(self, batch_size: int) -> tuple[float, dict[tuple[str, int], float], dict[tuple[str, int], float]]:
        return self.cycle_overheads.value(batch_size), self.call_overheads.value(batch_size), self.draft_passes.value()

    # -- decisions ----------------------------------------------------------------------------------

    def state(self, batch: ChainBatch) -> BatchState:
        """The batch's standing choice and its latest decision."""
        return self._batches.setdefault(batch, BatchState())

    def choose(self, batch: ChainBatch, chain: Sequence[str] | None = None, window: int = 0,
               ) -> tuple[tuple[str, ...], int]:
        """The (chain, window) of the batch's next cycle. A `chain` or a `window` the requests named narrows
        the choice to the candidates that have it (no exploration then)."""
        started = time.perf_counter_ns()
        with self.lock:
            state = self.state(batch)
            named = tuple(chain) if chain else None
            rows = [r for r in batch.rows.values() if r.finish_reason is None]
            common, shift = self.prompts.value(rows), self.records.value(rows)
            standing = (self._standing(batch, rows, common, shift, named, window)
                        if self.settings.decision_cycles > 1 else None)
            decision = state.last
            if (decision is None or decision is not state.current or standing is None or state.standing != standing
                    or state.stood >= self.settings.decision_cycles or not self._room(decision, rows)
                    or (named is None and not window and self.policy.exploring_due())):
                decision = self._decide(batch, state, rows, common, shift, named, window)
                state.standing, state.stood = standing, 0
            else:
                self.policy.stands(state)
            state.last = decision
            state.stood += 1
        self.decision_ns.add(time.perf_counter_ns() - started)
        return decision.chain, decision.window

    def _standing(self, batch: ChainBatch, rows: Sequence[Row], common: int, shift: int,
                  chain: tuple[str, ...] | None, window: int) -> tuple:
        """What a decision is made for: the batch's running rows, as their number per decoding mode in half
        octaves (`_size_class`; a lone row by its id), a lone row's lookup match, the rows' prompts' and
        records' shifts, the chain and window the requests named, the models the batch has and the
        profiler's snapshot. While it stays the same, the decision stands for `decision_cycles` cycles: a
        decision costs 1-6 ms (a plan made on the cycle's path where the models run in the router), at batch
        4 a tenth of a cycle, and the policy's hysteresis keeps a batch's choice from one cycle to the next
        anyway. A row that leaves as another of its mode joins (at batch 16, in most cycles, often a cycle
        apart) changes the plan's key only through the rows' shifts, which are part of this, so it does not
        end a decision by itself; nor does a batch's mix of matches, which changes nearly every cycle (in
        146 of 182 at batch 4). A lone row's match, which decides between the lookup's chains and the
        models', does. Explorations and the rows' last cycles are decided anew."""
        workers = getattr(batch, "workers", None)
        if len(rows) == 1:
            members = (rows[0].row_id,)
        else:
            modes = Counter(mode_of(r) for r in rows)
            members = tuple(_size_class(modes[m]) for m in Mode)
        return (members, self._match(batch, rows) if len(rows) == 1 else None, common, shift,
                chain, window, None if workers is None else frozenset(workers), self.planner.version())

    @staticmethod
    def _room(decision: Decision, rows: Sequence[Row]) -> bool:
        """Whether every row has room for two more cycles of the decision's window: near their ends the
        policy picks windows that fit what the rows have left."""
        return tokens_left(rows) > 2 * (decision.window + 1)

    def decision_for(self, batch: ChainBatch) -> Decision | None:
        """The decision of the batch's latest cycle."""
        state = self._batches.get(batch)
        return state.last if state else None

    def _decide(self, batch: ChainBatch, state: BatchState, rows: Sequence[Row], common: int, shift: int,
                chain: tuple[str, ...] | None, window: int) -> Decision:
        """The decision for the batch's running `rows`, their prompts' shift `common` and records' `shift`."""
        s = self.settings
        modes = Counter(mode_of(r) for r in rows)
        greedy, sampling, coupled = modes[Mode.GREEDY], modes[Mode.SAMPLING], modes[Mode.COUPLED]
        # the next cycle's lookup chains are priced by the lookup's match after each row's tokens
        match = self._match(batch, rows)
        base = plan = self.plan(greedy, sampling, common=common, coupled_rows=coupled, match=match)
        # the rows' record is of the pairs they ran, the standing chain's: rows that draft better than
        # predicted move those pairs alone (what one drafter finds easy another may not), rows that
        # draft worse move every pair (text hard for one drafter is hard for the others), so that the
        # record never makes a chain it did not measure look better than the one it did. A chain that
        # starts with a model-free level is the exception: what the lookup fails to copy says nothing of
        # what the models draft, so its rows' shortfall moves the pairs it proposes to alone (moving every
        # pair, a batch that had turned to text the lookup copies badly kept to its chains: after a run of
        # code, tables at batch 4 ran lookup -> target in 112 of 174 cycles, at 0.74x 1m -> 29m at W4)
        pairs = None
        if state.current is not None and shift > 0:
            pairs = frozenset(chain_pairs(state.current.chain))
        elif state.current is not None and shift < 0 and state.current.chain[0] in self.levels:
            pairs = frozenset(p for p in self.pairs if p[0] in self.levels)
        if shift:
            plan = self.plan(greedy, sampling, shift, pairs, common, coupled, match)
        scales = self.context_scales.value(rows)
        score: Score = t_eff
        solo = None
        if s.tail_weight > 0 and rows:   # with the same cycles for one row of the batch's main mode
            main = max(Mode, key=lambda m: modes[m])   # on ties, the enum's first (greedy)
            solo = plan if len(rows) == 1 else self.plan(int(main is Mode.GREEDY), int(main is Mode.SAMPLING),
                                                         shift, pairs, common, int(main is Mode.COUPLED))
        if solo is not None or scales:
            score = batch_score(rows, scales, solo, s.tail_weight, self.planner.finish_reach)
        workers = getattr(batch, "workers", None)   # the models the batch still has (one may have failed)
        usable = None if workers is None or set(self.models) <= set(workers) else frozenset(workers)
        decision = self.policy.decide(plan, state, rows, chain, window, score, scales, usable)
        if decision.prediction is not None and scales:
            decision.prediction = decision.prediction.scaled(scales)
        decision.base = base.by_key.get((decision.chain, decision.window))
        return decision

    # -- measurements ---------------------------------------------------------------------------------

    def prompt_reference(self, pair: Pair) -> float | None:
        """The pool's prompt agreement for `pair` (drafter, verifier, mode), None before any row ran it."""
        return self.prompts.reference(pair)

    def text_shifts(self) -> dict[Pair, float]:
        """Per pair, the log-odds its measured rates move by to describe the text the pool runs now
        (PromptAgreement.text_shifts)."""
        return self.prompts.text_shifts()

    def observe(self, report: CycleReport, rows: Sequence[Row], cycle_ns: int, auto: bool,
                decision: Decision | None = None) -> None:
        """One finished cycle: the router's own costs, its passes against the latency table, the rows'
        prompts and records, and the measured against the predicted figures."""
        with self.lock:
            inputs = self.planner.inputs
            self.context_scales.observe(report, rows, inputs.latency if inputs is not None else None)
            self.prompts.observe(report, rows)
            calls = 0
            for model, result in report.results.items():
                wall = report.call_ns.get(model, 0)
                calls += wall
                if wall:
                    self.call_overheads.observe(model, len(rows), len(result.timings), max(0, wall - result.forward_ns))
            # a late prefill is a catch-up (`catch_up_ns` prices it), not a cost every cycle pays
            self.cycle_overheads.observe(len(rows), max(0, cycle_ns - calls - report.late_prefill_ns))
            drafter = report.chain[0]
            draft = report.results.get(drafter)
            if len(rows) == 1 and len(report.chain) > 1 and draft is not None and inputs is not None:
                self.draft_passes.observe(drafter, report.window, sum(t.forward_ns for t in draft.timings[1:]),
                                          inputs.latency(drafter, 1, 1))
            self.cycle_ns.add(cycle_ns)
            now = self._clock()
            self.records.observe(report, rows, decision.base if decision is not None else None)
            prediction = decision.prediction if decision is not None else None
            self.ledgers.observe(report, rows, cycle_ns, auto, prediction)
            self.freshness.observe(report, rows, now)
