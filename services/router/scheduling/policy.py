"""The decision policy: among a plan's candidates, the (chain, window) of a batch's next cycle.

- fit: no window is longer than the most tokens a row has left to emit (a cycle emits at most window + 1;
  more is drafted and verified for nothing), unless the requests named it;
- batches draft at most `batch_max_window` tokens (unless the requests named the window): the tail
  score treats a batch's rows as alike but for chance, and rows of one kind of text differ for good (on
  literal tables one accepts nearly every draft, another half of them); a long window speeds up the rows
  that accept well and barely the others, and the batch waits for those while the drafter drafts. A
  chain that starts with a model-free level (the lookup) drafts for nothing, so its windows are not
  bounded: a longer proposal costs only the tokens its verifier feeds, which the cost model prices;
- settle (hysteresis): the batch keeps its chain unless another chain is predicted faster by
  `chain_hysteresis`, counting the catch-up of models that sat out (their pending tokens) spread over the
  cycles the batch is expected to run on (`switch_horizon_cycles` at most: a batch about to finish cannot
  earn back a catch-up); within its chain, or to a chain of fewer of its models, it moves when the best is
  predicted faster by `hysteresis`. A window change costs nothing; a chain that brings in models not in
  use costs their catch-up and rests on their older estimates;
- explore: a pair of models that has not been measured for a while (or never) gets one cycle of the best
  chain that contains it, at its best window plus `explore_extra_window` (so deeper draft positions get
  measured too), at most once every `explore_every_cycles` cycles of the router. A while is
  `explore_after_s` for a pair whose best chain is predicted within `explore_gap` of the best, and
  proportionally longer for one further behind (up to `explore_after_max_s`): its estimate would have to
  be that much off to matter, and each exploration costs a slower cycle and a catch-up. An overdue pair
  waits for a batch whose rows its chain's models have all seen (at batch 1, a request's first cycle:
  every model prefilled it), up to `explore_patience` times its wait (longer where the catch-up costs
  more cycles than that), so that it pays no catch-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from specrouter.contract.measures import Mode
from specrouter.router.row import Row
from specrouter.router.scheduling.candidates import chain_pairs, mode_of
from specrouter.router.scheduling.cycle_cost import Prediction
from specrouter.router.scheduling.freshness import PairFreshness
from specrouter.router.scheduling.plans import Plan
from specrouter.router.scheduling.scoring import NO_SCALES, Score, least, t_eff, tokens_left
from specrouter.router.scheduling.settings import SchedulerSettings

EXPLORE_CHECK_S = 0.5   # a standing decision looks at the pairs for an exploration at most this often


@dataclass
class Decision:
    chain: tuple[str, ...]
    window: int
    prediction: Prediction | None     # None: a named chain the scheduler does not plan
    base: Prediction | None = None    # the same candidate under the pool's acceptance (no batch shift)


@dataclass
class BatchState:
    current: Decision | None = None   # the standing choice (explorations do not replace it)
    last: Decision | None = None      # the decision of the latest cycle, exploration or not
    cycles: int = 0
    standing: tuple | None = None     # what the latest decision was made for (`Scheduler.choose`)
    stood: int = 0                    # cycles it has served


class Policy:
    def __init__(self, settings: SchedulerSettings, target: str, chains: Sequence[tuple[str, ...]],
                 pairs: Sequence[tuple[str, str]], freshness: PairFreshness, clock: Callable[[], float],
                 counts: dict[str, int], free: Sequence[str] = ()):
        """`free`: the levels that run no model (their chains' windows are not bounded at batch sizes > 1)."""
        self.settings, self.target, self.chains, self.pairs = settings, target, list(chains), list(pairs)
        self.free = frozenset(free)
        self.freshness, self._clock, self.counts = freshness, clock, counts
        self._cycles = 0                          # decisions of every batch, for the exploration rate
        self._last_explore_cycle = -(10**9)
        self._explore_checked_at = -math.inf      # when the pairs were last looked at for an exploration

    def stands(self, state: BatchState) -> None:
        """A cycle that the batch's standing decision serves again: counted as a decision is towards the
        next exploration."""
        state.cycles += 1
        self._cycles += 1

    def exploring_due(self) -> bool:
        """Whether an exploration may be due in the next cycle: enough cycles passed since the last one, and
        the pairs were last looked at for one a while ago (their waits are seconds: `explore_after_s`)."""
        return (self._cycles + 1 - self._last_explore_cycle >= self.settings.explore_every_cycles
                and self._clock() - self._explore_checked_at >= EXPLORE_CHECK_S)

    def decide(self, plan: Plan, state: BatchState, rows: Sequence[Row],
               chain: tuple[str, ...] | None, window: int, score: Score = t_eff,
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
        left = tokens_left(rows)
        room = min(left, s.batch_max_window + 1 if len(rows) > 1 else math.inf)
        candidates = named if window else ([p for p in named if len(p.chain) == 1
                                            or p.window < (left if p.chain[0] in self.free else room)]
                                           or [min(named, key=lambda p: p.cost_ns)])
        if score is not t_eff:   # by the bound, cheap to compute: the score is never below it
            candidates = sorted(candidates, key=lambda p: p.scaled_cost_ns(scales) / p.emitted)
        if chain is None and not window:
            explore = self.exploration(plan, rows, predictions)
            if explore is not None:
                self._last_explore_cycle = self._cycles
                self.counts["explorations"] += 1
                return explore
        state.current = decision = self.settle(plan, state.current, candidates, rows, chain is None, score, scales)
        return decision

    def settle(self, plan: Plan, current: Decision | None, candidates: Sequence[Prediction], rows: Sequence[Row],
               chain_free: bool, score: Score = t_eff, scales: Mapping[str, float] = NO_SCALES) -> Decision:
        """The hysteresis: the standing choice, its window moved or its chain switched only when worth it.
        `candidates`: the allowed predictions in increasing order of a lower bound of `score` (their scaled
        T_eff), so that the least score is found scoring only those whose bound is below it."""
        s = self.settings
        best = least(candidates, score, scales)
        kept = None if current is None else plan.by_key.get((current.chain, current.window))
        same = None if kept is None else least([p for p in candidates if p.chain == kept.chain], score, scales)
        if kept is None or same is None:   # nothing standing, or its chain is not allowed any more
            if current is not None and (current.chain, current.window) != (best.chain, best.window):
                self.counts["switches"] += 1
            return Decision(best.chain, best.window, best)
        # the standing chain at its best allowed window, if that is worth moving to (or kept no longer fits)
        allowed = any(p is kept for p in candidates)
        target = same if not allowed or score(same) < score(kept) * (1 - s.hysteresis) else kept
        if best.chain != kept.chain and chain_free:
            horizon = min(s.switch_horizon_cycles, max(1.0, tokens_left(rows) / best.emitted))
            catch_up = catch_up_ns(plan, best.chain, rows, scales)
            best_t = score(best) * (1 + catch_up / horizon / best.scaled_cost_ns(scales))
            # dropping levels brings in no model that sat out: it is as cheap and as sure as a window change
            margin = s.chain_hysteresis if set(best.chain) - set(kept.chain) else s.hysteresis
            if best_t < score(target) * (1 - margin):
                target = best
        if target is not kept:
            self.counts["switches"] += 1
        return Decision(target.chain, target.window, target)

    def exploration(self, plan: Plan, rows: Sequence[Row],
                    predictions: Sequence[Prediction] | None = None) -> Decision | None:
        """An exploration cycle for the most overdue pair, in the best of `predictions` (by default the
        plan's) that holds it; None when no pair is due."""
        s = self.settings
        predictions = plan.predictions if predictions is None else predictions
        if self._cycles - self._last_explore_cycle < s.explore_every_cycles or len(self.chains) < 2:
            return None
        now = self._explore_checked_at = self._clock()
        present = {mode_of(r) for r in rows}
        modes = [m for m in Mode if m in present]   # in the enum's order: on ties, greedy first
        stale = []
        for d, v in self.pairs:
            wait = self.exploration_wait(plan, (d, v))
            for mode in modes:
                age = now - self.freshness.value((d, v, mode))
                if age >= wait:
                    stale.append((age / max(wait, 1e-9), (d, v, mode)))
        # the most overdue first, in the best-ranked chain that holds it, at its window + extra; a chain whose
        # models missed tokens of the rows must feed them first (the catch-up), which can cost more than the
        # exploration cycle itself (at batch 1, a prefill of the whole row by a model that never saw it; at
        # batch 16, of sixteen rows), so it waits for a batch with none, up to `explore_patience` times
        # overdue, and longer where the catch-up costs more cycles than that: an exploration's price is its
        # cycle and its catch-up, and a pair waits in proportion to it
        for overdue, (d, v, mode) in sorted(stale, key=lambda item: item[0], reverse=True):   # ties: greedy first
            p = next((p for p in predictions if (d, v) in chain_pairs(p.chain)), None)
            if p is None:
                continue
            catch_up = catch_up_ns(plan, p.chain, rows)
            if catch_up > 0 and overdue < max(s.explore_patience, 1.0 + catch_up / p.cost_ns):
                continue
            window = p.window + s.explore_extra_window
            if (p.chain, window) not in plan.by_key:   # past the chain's longest window: its best stands
                window = p.window
            prediction = plan.by_key.get((p.chain, window), p)
            self.freshness.mark((d, v, mode), now)   # asked for; the snapshot confirms it later
            return Decision(p.chain, window, prediction)
        return None

    def exploration_wait(self, plan: Plan, pair: tuple[str, str]) -> float:
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


def catch_up_ns(plan: Plan, chain: Sequence[str], rows: Sequence[Row],
                scales: Mapping[str, float] = NO_SCALES) -> float:
    """Extra cost of the models in `chain` that must first feed the tokens they missed."""
    extra = 0.0
    for model in chain:
        lag = max((len(r.tokens) - r.seen.get(model, len(r.tokens)) for r in rows), default=0)
        if lag > 2:
            scale = scales.get(model, 1.0)
            extra += scale * (plan.latency(model, len(rows), lag) - plan.latency(model, len(rows), 1))
    return max(extra, 0.0)
