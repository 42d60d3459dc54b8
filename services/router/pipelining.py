"""Whether a pipelined batch's next cycle runs an ahead draft: where it measures faster than lock-step.

An ahead draft is free only where the drafter has compute of its own (a device per worker). Where the
workers share cores, the drafter's ahead draft slows the target's verification beside it, and a cycle
whose emitted tokens leave the drafter's guess behind throws the ahead draft away. So the router measures
both kinds of cycle, per (chain, window, batch size), and prices them as each runs:

    lock-step   D + V            the drafter drafts, then the levels above verify
    pipelined   (1 - p) D + O    the drafter drafts only when the last ahead draft was not taken, and the
                                 levels above verify beside the next one; the cycle waits for both,
                                 O = max(V', A)

D: the drafter's draft call; V: the calls of the levels above in a cycle without an ahead draft; V' and A:
those calls and the ahead draft's in a cycle with one; p: the share of the cycles after an ahead draft that
take their proposal from it. The router's own work is the same either way and drops out, and so do the
tokens a cycle emits (an ahead proposal is drawn as a fresh draft would be, and verified the same way).
Pipelining pays when O - V < p D: what the ahead draft adds to the verification is less than the drafting
it saves.

A cycle can take the ahead draft only if the cycle before accepted its whole proposal at every level, and
then only if the drafter also guessed the tokens the levels added: p = q r, with q the share of cycles that
accept everything and r the share of those whose ahead draft the next cycle takes. q is the text's (tables
about 0.6, code about 0.2 on the demo pool) and is measured in every cycle, pipelined or not, so the price
follows the text from one request to the next; r, the drafter's guess of one more token where it guessed
all before, is measured where an ahead draft ran.

Each key starts with a trial of each mode (`trial_cycles` cycles), then runs the one priced cheaper. The
mode it does not run is measured again by another trial after `recheck_cycles` cycles, or up to
RECHECK_STRETCH times as many when the two prices lie far apart (a trial of the dearer mode costs its gap
on each of its cycles): p moves with the text, and O with whatever else runs on the workers' cores. A
trial's cycles outweigh what its mode measured before it, which is stale by then.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from specrouter.router.cycle_report import CycleReport
from specrouter.router.scheduling.ema import Ema, power_of_two

log = logging.getLogger(__name__)

Key = tuple[tuple[str, ...], int, int]   # (chain, window, batch size rounded up to a power of two)
RECHECK_STRETCH = 4        # the most times recheck_cycles that a far dearer mode waits for its next trial
RECHECK_GAP = 0.05         # the gap between the prices (of the cheaper) at which the wait starts to stretch
STALE_WEIGHT = 0.25        # what a trial leaves of the weight of its mode's earlier measures


@dataclass
class PipelineMeasures:
    """What one key's cycles measured (ns, and the shares q and r), and where its trials stand."""

    alpha: float
    draft: Ema = field(init=False)          # D
    lock_levels: Ema = field(init=False)    # V
    ahead_levels: Ema = field(init=False)   # O
    whole: Ema = field(init=False)          # q
    taken: Ema = field(init=False)          # r
    trial: bool | None = None               # the mode on trial (True: pipelined), None: none
    trial_left: int = 0
    since_trial: int = 0
    pipelining: bool | None = None          # the last choice, for the log when it changes

    def __post_init__(self) -> None:
        self.draft, self.lock_levels, self.ahead_levels, self.whole, self.taken = (Ema(self.alpha) for _ in range(5))

    def p(self) -> float:
        """q r; while no ahead draft has followed a cycle that accepted everything, r is taken as 1 (what the
        pipelined cycles then run measures it)."""
        return self.whole.get() * self.taken.get(1.0)

    def prices(self) -> tuple[float, float]:
        """(lock-step, pipelined): D + V and (1 - p) D + O, on what has been measured."""
        d = self.draft.get()
        return d + self.lock_levels.get(), (1.0 - self.p()) * d + self.ahead_levels.get()

    def pays(self) -> bool:
        """O - V < p D."""
        lock, pipelined = self.prices()
        return pipelined < lock

    def recheck_after(self, cycles: int) -> int:
        """Cycles before the mode not run has its next trial: `cycles`, stretched while its price is far above."""
        lock, pipelined = self.prices()
        gap = abs(lock - pipelined) / max(min(lock, pipelined), 1.0)
        return int(cycles * min(RECHECK_STRETCH, max(1.0, gap / RECHECK_GAP)))


class PipelineGate:
    """Decides, cycle by cycle, whether a pipelined batch runs its ahead draft, from the batches' measured
    cycles (one gate serves every batch of a router: how much an ahead draft slows the verification is the
    workers' matter, not a batch's)."""

    def __init__(self, trial_cycles: int = 8, recheck_cycles: int = 100, alpha: float = 0.1):
        if trial_cycles < 2:
            raise ValueError(f"trial_cycles must be >= 2 (a pipelined trial takes an ahead draft from its second "
                             f"cycle on), got {trial_cycles}")
        if recheck_cycles < 1:
            raise ValueError(f"recheck_cycles must be >= 1, got {recheck_cycles}")
        self.trial_cycles = trial_cycles
        self.recheck_cycles = recheck_cycles
        self.alpha = alpha
        self.measures: dict[Key, PipelineMeasures] = {}

    def _measures(self, chain: Sequence[str], window: int, rows: int) -> PipelineMeasures:
        """The measures of (chain, window, batch size rounded up to a power of two), made on first use."""
        key = (tuple(chain), window, power_of_two(rows))
        m = self.measures.get(key)
        if m is None:
            m = self.measures[key] = PipelineMeasures(self.alpha)
        return m

    def wants(self, chain: Sequence[str], window: int, rows: int) -> bool:
        """Whether the next cycle of `chain` at `window` over `rows` rows runs an ahead draft."""
        if len(chain) < 2:
            return False   # the target alone drafts nothing ahead
        m = self._measures(chain, window, rows)
        if m.trial_left == 0:
            m.since_trial += 1
            if m.lock_levels.count == 0 or m.draft.count == 0:
                self._start_trial(m, False)
            elif m.ahead_levels.count == 0:
                self._start_trial(m, True)
            elif m.since_trial > m.recheck_after(self.recheck_cycles):
                self._start_trial(m, not m.pays())
        if m.trial_left > 0:
            m.trial_left -= 1
            return bool(m.trial)
        pays = m.pays()
        if pays != m.pipelining:
            m.pipelining = pays
            self._log_choice(chain, window, rows, m)
        return pays

    def _start_trial(self, m: PipelineMeasures, pipelined: bool) -> None:
        """A trial of one mode; what that mode measured before is stale (the cores' load may have changed
        since), so the trial's cycles count for most of its estimates."""
        m.trial, m.trial_left, m.since_trial = pipelined, self.trial_cycles, 0
        for measure in (m.ahead_levels,) if pipelined else (m.lock_levels,):
            measure.forget(STALE_WEIGHT)

    def observe(self, report: CycleReport, rows: int, after_ahead: bool) -> None:
        """One cycle's calls. `after_ahead`: the batch's cycle before ran an ahead draft for the same chain
        and window and accepted its whole proposal, so this one could take its proposal from it."""
        chain = report.chain
        if len(chain) < 2:
            return
        m = self._measures(chain, report.window, rows)
        levels = sum(report.call_ns.get(model, 0) for model in chain[1:])
        if not report.from_ahead and chain[0] in report.call_ns:
            m.draft.add(report.call_ns[chain[0]])
        if report.ahead is not None:
            m.ahead_levels.add(max(levels, report.ahead_ns))
        else:
            m.lock_levels.add(levels)
        m.whole.add(1.0 if report.accepted_whole() else 0.0)
        if after_ahead:
            m.taken.add(1.0 if report.from_ahead else 0.0)

    def _log_choice(self, chain: Sequence[str], window: int, rows: int, m: PipelineMeasures) -> None:
        adds = (m.ahead_levels.get() - m.lock_levels.get()) / 1e6
        saves = m.p() * m.draft.get() / 1e6
        log.debug("%s at window %d, %d row(s): %s (the ahead draft adds %.1f ms to the verification and saves "
                  "%.1f ms of drafting a cycle: %.0f%% of the cycles accept everything, %.0f%% of those leave the "
                  "next its proposal)", ",".join(chain), window, rows, "pipelined" if m.pipelining else "lock-step",
                  adds, saves, 100 * m.whole.get(), 100 * m.taken.get(1.0))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per key, the measures and the choice they make (in ms and shares), for a reader or a test."""
        out = {}
        for (chain, window, rows), m in self.measures.items():
            out[f"{','.join(chain)} W{window} B{rows}"] = {
                "draft_ms": m.draft.get() / 1e6, "lock_levels_ms": m.lock_levels.get() / 1e6,
                "ahead_levels_ms": m.ahead_levels.get() / 1e6, "whole": m.whole.get(), "taken": m.taken.get(),
                "pipelined": float(m.pays())}
        return out
