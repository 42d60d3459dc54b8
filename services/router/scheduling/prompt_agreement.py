"""How a row's prompt says it will draft, before it drafts anything.

At prefill every model returns its argmax next token at each of the prompt's last `prompt_positions`
positions, and where two models agree more, the drafts of one are accepted by the other more often
(on the demo pool, English prose and repetitive tables differ in both). The pool's agreement per pair is
kept as an EMA over the same checks as the profiler's acceptance rates (the rows those rates were
measured on), and a batch whose rows agree more or less than that is planned with every pair's
acceptance shifted by `prompt_slope` times the difference in log-odds, within `prompt_odds_cap`
(`value`). One prompt's agreement is a noisy guess at its own acceptance (within one kind of text they
barely correlate), while the agreement of the last few rows tells one kind from another well: each
row's is shrunk by `prompt_prior_positions` towards that of the recent rows (an EMA with
`prompt_recent_alpha` per check). When the workload changes kind, the pool's rates take a few hundred
checks to follow; the shift stands in meanwhile and fades as they catch up.

A pair the batches stopped running keeps the rates of the text it ran last, which the shift, weighted
by the pairs' recent use, does not correct: so each pair's measured rates are moved by `text_slope`
times the log-odds between the agreement of the rows the pool runs now and that of the rows the pair
ran (`text_shifts`), which is nothing for a pair in use.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from specrouter.contract.measures import EmaConstants
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.scheduling.acceptance import logit
from specrouter.router.scheduling.candidates import Pair, chain_pairs, mode_of
from specrouter.router.scheduling.ema import Ema
from specrouter.router.scheduling.settings import SchedulerSettings


class PromptAgreement:
    def __init__(self, pairs: Sequence[tuple[str, str]], settings: SchedulerSettings):
        self.pairs, self.settings = list(pairs), settings
        # per pair: the pool's prompt agreement, an EMA over the checks at position 0 of the rows that ran
        # it with the profiler's acceptance constant (taken from the snapshot), and the recent rows'
        self._alpha = EmaConstants.acceptance_alpha
        self._reference: dict[Pair, Ema] = defaultdict(lambda: Ema(self._alpha))
        self._recent: dict[Pair, Ema] = defaultdict(lambda: Ema(settings.prompt_recent_alpha))
        # ... and the agreement of every row the pool runs, whichever chain: the text it serves now
        self._text: dict[Pair, Ema] = defaultdict(lambda: Ema(self._alpha))
        self._shares: Mapping[tuple[Pair, int], float] = {}

    def note_snapshot(self, acceptance_alpha: float, shares: Mapping[tuple[Pair, int], float]) -> None:
        """The profiler's acceptance constant (0: unchanged) and each (pair, position)'s share of the pool's
        recent reports (acceptance.RecentReports), which weigh the pairs in `value`."""
        if acceptance_alpha > 0:
            self._alpha = acceptance_alpha
        self._shares = shares

    def observe(self, report: CycleReport, rows: Sequence[Row]) -> None:
        """The pool's prompt agreement per pair: each row's, once per check at position 0 it ran; and the
        text the pool drafts on, every row's once per cycle it drafted in, for every pair (so that for the
        pair the pool runs the two are one EMA; a cycle of the target alone moves neither). The lookup's
        pairs, judged in every cycle (`CycleReport.shadow`), count as run."""
        drafted = [any(counts[r_index] for counts in report.proposed.values()) for r_index in range(len(rows))]
        for r_index, r in enumerate(rows):
            if not drafted[r_index]:
                continue
            mode = mode_of(r)
            for d, v in self.pairs:
                hit = r.prompt_agreement.get((d, v))
                if hit is not None and hit[1]:
                    text = self._text[(d, v, mode)]
                    text.alpha = self._alpha
                    text.add(hit[0] / hit[1])
        ran = {(d, v): [bool(n) for n in report.proposed[v]] for d, v in chain_pairs(report.chain)}
        for pair, per_row in report.shadow.items():   # judged without running, in the cycles that drafted
            ran[pair] = [j is not None and j[1] > 0 and d for j, d in zip(per_row, drafted)]
        for (d, v), checked in ran.items():
            for r_index, r in enumerate(rows):
                hit = r.prompt_agreement.get((d, v))
                if hit is None or not hit[1] or not checked[r_index]:
                    continue
                pair = (d, v, mode_of(r))
                self._reference[pair].alpha = self._alpha   # the snapshot's, which may change
                self._reference[pair].add(hit[0] / hit[1])
                self._recent[pair].add(hit[0] / hit[1])

    def value(self, rows: Sequence[Row]) -> int:
        """The batch's acceptance shift from its rows' prompts, in whole `batch_odds_step`s.

        Per row and pair: its models' agreement on the prompt, a (shrunk by `prompt_prior_positions`
        towards the recent rows' agreement), against the pool's agreement b: `prompt_slope` *
        (logit(a) - logit(b)), averaged over the pairs by their share of the pool's recent cycles, then
        over the rows (a row without an agreement counts 0), within `prompt_odds_cap` either way. b is an
        EMA over the same checks as the profiler's acceptance, so the shift says how this batch differs
        from the rows the pool's rates describe, and fades as those rates catch up with a new kind of text."""
        s = self.settings
        if s.prompt_slope <= 0 or s.batch_odds_step <= 0 or not rows:
            return 0
        total = 0.0
        for r in rows:
            if not r.prompt_agreement:
                continue
            mode = mode_of(r)
            num = den = 0.0
            for d, v in self.pairs:
                hit = r.prompt_agreement.get((d, v))
                pool = self.reference((d, v, mode))
                weight = self._shares.get(((d, v, mode), 0), 0.0)
                if hit is None or pool is None or weight <= 0:
                    continue
                recent = self._recent.get((d, v, mode))
                prior = recent.get(pool) if recent is not None else pool
                same, n = hit
                rate = (same + s.prompt_prior_positions * prior) / (n + s.prompt_prior_positions)
                num += weight * (logit(rate) - logit(pool))
                den += weight
            if den > 0:
                total += num / den
        shift = max(-s.prompt_odds_cap, min(s.prompt_odds_cap, s.prompt_slope * total / len(rows)))
        return int(round(shift / s.batch_odds_step))

    def reference(self, pair: Pair) -> float | None:
        """The pool's prompt agreement for `pair` (drafter, verifier, mode), None before any row ran it."""
        ref = self._reference.get(pair)
        return ref.get() if ref is not None and ref.weight > 0 else None

    def recent(self, pair: Pair) -> float | None:
        """The recent rows' prompt agreement for `pair`, None before any row ran it."""
        recent = self._recent.get(pair)
        return recent.get() if recent is not None and recent.weight > 0 else None

    def text_shifts(self) -> dict[Pair, float]:
        """Per pair, the log-odds its measured rates move by to describe the text the pool runs now:
        `text_slope` times logit(agreement of the rows the pool runs now) - logit(agreement of the rows
        the pair's rates were measured on), within `prompt_odds_cap`; 0 where either is unknown.

        The profiler's rates of a pair are of the text the pair last ran on, and a pair the batches
        stopped running keeps them while the text changes (a pair left on tables holds their rates
        through the first prose requests, while the pair running falls to prose's). Both agreements are
        EMAs over the same kind of count, one per row and cycle (the pool's over every cycle that drafted,
        the pair's over those that checked it), so for the pair in use they are one and its rates stay as
        measured. Cycles of the target alone are left out of both: a target-only request runs several
        times the cycles of a chain's, and counted in the pool's alone they would weigh the latest prompts
        more there than in the pair's, and shift the pair in use."""
        slope, cap = self.settings.text_slope, self.settings.prompt_odds_cap
        if slope <= 0:
            return {}
        out = {}
        for pair, ref in list(self._reference.items()):
            now = self._text.get(pair)
            if ref.weight > 0 and now is not None and now.weight > 0:
                out[pair] = max(-cap, min(cap, slope * (logit(now.get()) - logit(ref.get()))))
        return out
