"""The scheduler report's arithmetic: what a configuration measured, summed, and turned into result records.

Everything here works on plain numbers, so it is tested without a router.

- `LedgerSum` / `AcceptanceTally`: the router's cycle and pair ledgers, summed over the cycles of a run.
- `Measured`: everything one configuration measured over the passes of one workload.
- `spearman`, `held_out_picks`, `units_rate`, `wave_ratio_se`, `log_ratio_se`: the statistics the comparisons rest on.
- `screening_result` / `runoff_result`: a workload's measurements as a `RunResult` and its `Runoff`.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Self

from specrouter.report.scheduler_results import (Acceptance, AdaptiveResult, BestStatic, Choice, Config,
                                                 RankCorrelation, RowCycles, Runoff, RunoffStatic, RunResult,
                                                 StaticResult, Wave)

ACCEPTANCE_MIN_CHECKS = 200  # a pair is "in use" by the adaptive scheduler with at least this many checks

Unit = tuple[int, float]     # what a configuration measured in one wave: (tokens, seconds)


class _FieldSum:
    """A dataclass of numbers that adds and subtracts field by field."""

    def add(self, other: Self) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def minus(self, other: Self) -> Self:
        return type(self)(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


@dataclass
class LedgerSum(_FieldSum):
    """Cycles of the router's ledgers, summed: how many, their wall time, the tokens a row emitted in them,
    and the scheduler's prediction of the last two."""

    cycles: int = 0
    cycle_ms: float = 0.0
    emitted: float = 0.0
    predicted_cycle_ms: float = 0.0
    predicted_emitted: float = 0.0

    def choice(self) -> Choice:
        """Per cycle, predicted beside measured."""
        n = self.cycles
        return Choice(int(n), self.predicted_cycle_ms / n, self.cycle_ms / n, self.predicted_emitted / n,
                      self.emitted / n)


@dataclass
class AcceptanceTally(_FieldSum):
    """A pair's draft tokens accepted and checked by its verifier, and the scheduler's prediction of both."""

    accepted: float = 0.0
    checked: float = 0.0
    predicted_accepted: float = 0.0
    predicted_checked: float = 0.0


Pair = tuple[str, str, str]   # (drafter, verifier, mode)


@dataclass
class Measured:
    """One configuration over the passes of one workload."""

    tokens_per_s: list[float] = field(default_factory=list)   # per pass
    tokens: int = 0                                            # of the current pass
    seconds: float = 0.0
    waves: list[Unit] = field(default_factory=list)            # every wave of every pass
    predicted_t_eff_ms: list[float] = field(default_factory=list)
    predicted_static: list[tuple[float, float]] = field(default_factory=list)  # (cycle ms, emitted) before each run
    total: LedgerSum = field(default_factory=LedgerSum)        # every cycle of the configuration
    # the cycles that ran at the run's batch size (a wave's rows join and finish apart, so some run smaller)
    at_batch: LedgerSum = field(default_factory=LedgerSum)
    chain_counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    pairs: dict[Pair, AcceptanceTally] = field(default_factory=lambda: defaultdict(AcceptanceTally))
    per_config: dict[str, LedgerSum] = field(default_factory=lambda: defaultdict(LedgerSum))  # adaptive's choices
    planning_ms: float = 0.0    # the router's planner (and inline plans) while this configuration ran
    # per (chain and window run, rows in the cycle); a wave's tail runs fewer rows
    by_rows: dict[tuple[str, int], LedgerSum] = field(default_factory=lambda: defaultdict(LedgerSum))
    # adaptive, per wave run (in the order of `waves`): its choices in that wave, as in `per_config`
    wave_choices: list[dict[str, LedgerSum]] = field(default_factory=list)

    def add_wave(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.waves.append((tokens, seconds))

    def end_pass(self) -> None:
        self.tokens_per_s.append(self.tokens / self.seconds)
        self.tokens, self.seconds = 0, 0.0

    def rate(self) -> float:
        """Tokens per second of the current pass so far."""
        return self.tokens / self.seconds


# -- statistics -----------------------------------------------------------------------------------

def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def held_out_picks(waves: Sequence[Sequence[Unit]]) -> list[Unit] | None:
    """Per measured unit, the (tokens, seconds) of the best static picked without looking at that unit.

    `waves[c][u]` is configuration c's (tokens, seconds) in measured unit u (a wave of a pass). For every
    unit, the configuration fastest over all the other units is charged that unit's tokens and seconds.
    The plain best of many noisy configurations is biased upwards (its noise is part of why it won);
    this estimate is not. None with fewer than two units.
    """
    units = min((len(w) for w in waves), default=0)
    if units < 2:
        return None
    totals = [(sum(t for t, _ in w[:units]), sum(s for _, s in w[:units])) for w in waves]
    picks = []
    for u in range(units):
        pick = max(range(len(waves)), key=lambda c: (totals[c][0] - waves[c][u][0]) / (totals[c][1] - waves[c][u][1]))
        picks.append(waves[pick][u])
    return picks


def held_out_best(waves: Sequence[Sequence[Unit]]) -> float | None:
    """Tokens per second of the best static picked without looking at the wave it is measured on
    (`held_out_picks`, over every unit). None with fewer than two units."""
    picks = held_out_picks(waves)
    return None if picks is None else units_rate(picks)


def units_rate(units: Sequence[Unit]) -> float:
    """Tokens per second over measured units, each (tokens, seconds)."""
    return sum(t for t, _ in units) / sum(s for _, s in units)


def wave_ratio_se(a: Sequence[Unit], b: Sequence[Unit]) -> float | None:
    """The standard error of the mean log ratio of the speeds of two configurations' waves, paired wave by
    wave ((tokens, seconds) each): about the relative standard error of the ratio of their speeds. None with
    fewer than two waves."""
    measured = [(ta / sa, tb / sb) for (ta, sa), (tb, sb) in zip(a, b) if min(ta, sa, tb, sb) > 0]
    return log_ratio_se([x for x, _ in measured], [y for _, y in measured])


def log_ratio_se(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The standard error of the mean log ratio of paired speeds (pairs with a speed of 0 left out): about
    the relative standard error of the ratio of the two. None with fewer than two pairs."""
    logs = [math.log(x / y) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len(logs) < 2:
        return None
    return statistics.stdev(logs) / math.sqrt(len(logs))


def t_eff(m: Measured) -> float | None:
    """The router's milliseconds of cycle per token of a row, over every cycle of the configuration."""
    return m.total.cycle_ms / m.total.emitted if m.total.emitted else None


def outside_ms(m: Measured, batch: int) -> float | None:
    """Client milliseconds per token not spent in the router's cycles: the client's time over its
    tokens, less the cycles' time over the tokens they emitted (per row; a wave's B rows in flight share
    each cycle)."""
    tokens = sum(t for t, _ in m.waves)
    if not tokens or not m.total.emitted:
        return None
    return sum(x for _, x in m.waves) * 1e3 / tokens - t_eff(m) / batch


# -- records of one configuration -----------------------------------------------------------------

def choices(per_config: Mapping[str, LedgerSum]) -> dict[str, Choice]:
    """Adaptive's choices, most cycles first: per (chain, window), predicted beside measured over the cycles
    it was chosen (a choice predicted faster than it measures is the optimism of picking the least of
    noisy estimates)."""
    return {label: s.choice() for label, s in sorted(per_config.items(), key=lambda kv: -kv[1].cycles)}


def wave_table(adaptive: Measured, statics: Sequence[Measured], per_pass: int) -> list[Wave]:
    """Adaptive wave by wave beside the statics' (every wave of every pass, in order: `wave` is its index
    in the pass): where it won and lost, and what it chose there. Target-only is among the statics: where
    drafting does not pay it is the best static, and without it adaptive would read well ahead in waves
    where it runs exactly what target-only runs."""
    return [Wave(i % per_pass, tokens / seconds, [s.waves[i][0] / s.waves[i][1] for s in statics if len(s.waves) > i],
                 choices(chosen))
            for i, ((tokens, seconds), chosen) in enumerate(zip(adaptive.waves, adaptive.wave_choices))]


def cycles_by_rows(m: Measured) -> list[RowCycles]:
    """The configuration's cycles per (chain and window run, rows in the cycle), longest rows first within a
    configuration. A wave's rows finish apart, so its last cycles run fewer rows; comparing two
    configurations' cycles at one (chain, window) means comparing them at equal rows."""
    return [RowCycles(label, rows, int(s.cycles), s.cycle_ms / s.cycles, s.emitted / s.cycles,
                      s.cycle_ms / s.emitted if s.emitted else None)
            for (label, rows), s in sorted(m.by_rows.items(), key=lambda kv: (kv[0][0], -kv[0][1])) if s.cycles]


def acceptance(pairs: Mapping[Pair, AcceptanceTally]) -> list[Acceptance]:
    """Every pair that was checked, predicted beside realized."""
    return [Acceptance((d, v), mode, t.accepted / t.checked,
                       t.predicted_accepted / t.predicted_checked if t.predicted_checked > 0 else None,
                       t.accepted, t.checked, t.predicted_accepted, t.predicted_checked,
                       t.checked >= ACCEPTANCE_MIN_CHECKS)
            for (d, v, mode), t in sorted(pairs.items()) if t.checked > 0]


def overall_acceptance(runs: Sequence[RunResult]) -> list[Acceptance]:
    """Acceptance over every run's adaptive cycles."""
    pairs: dict[Pair, AcceptanceTally] = defaultdict(AcceptanceTally)
    for run in runs:
        for a in run.acceptance:
            pairs[(*a.pair, a.mode)].add(
                AcceptanceTally(a.accepted, a.checked, a.predicted_accepted, a.predicted_checked))
    return acceptance(pairs)


def rank_correlation(runs: Sequence[RunResult]) -> RankCorrelation:
    correlations = [r.rank_correlation for r in runs if r.rank_correlation is not None]
    return RankCorrelation(statistics.fmean(correlations) if correlations else None,
                           min(correlations) if correlations else None)


# -- records of a workload ------------------------------------------------------------------------

def _static(config: Config, m: Measured) -> StaticResult:
    n, predicted = m.total.cycles, m.predicted_static
    return StaticResult(
        chain=config.chain, window=config.window,
        tokens_per_s=statistics.median(m.tokens_per_s), tokens_per_s_runs=m.tokens_per_s,
        predicted_t_eff_ms=statistics.fmean(m.predicted_t_eff_ms) if m.predicted_t_eff_ms else None,
        # what the prediction, made for B rows, is about
        measured_t_eff_ms=m.at_batch.cycle_ms / m.at_batch.emitted if m.at_batch.emitted else t_eff(m),
        cycles=n, measured_t_eff_all_cycles_ms=t_eff(m), cycles_at_batch_size=int(m.at_batch.cycles),
        predicted_cycle_ms=statistics.fmean(c for c, _ in predicted) if predicted else None,
        predicted_emitted=statistics.fmean(e for _, e in predicted) if predicted else None,
        measured_cycle_ms=m.total.cycle_ms / n if n else None,
        measured_emitted=m.total.emitted / n if n else None)


def _adaptive(m: Measured) -> AdaptiveResult:
    total = m.total
    return AdaptiveResult(
        predicted_t_eff_ms=total.predicted_cycle_ms / total.predicted_emitted if total.predicted_emitted else None,
        measured_t_eff_ms=t_eff(m), cycles=total.cycles,
        measured_cycle_ms=total.cycle_ms / total.cycles if total.cycles else None,
        measured_emitted=total.emitted / total.cycles if total.cycles else None,
        chain_counts=dict(sorted(m.chain_counts.items(), key=lambda kv: -kv[1])),
        cycles_per_config={label: int(s.cycles) for label, s in
                           sorted(m.per_config.items(), key=lambda kv: -kv[1].cycles)},
        per_config=choices(m.per_config))


def _best(static: StaticResult | RunoffStatic) -> BestStatic:
    return BestStatic(static.chain, static.window, static.tokens_per_s)


def screening_result(kind: str, batch: int, requests: int, measured: Mapping[Config, Measured]) -> RunResult:
    """The screening of one workload at one batch size: every static by its median pass beside adaptive's."""
    statics = [_static(config, m) for config, m in measured.items() if config.chain is not None]
    target_only = next(x for x in statics if len(x.chain) == 1)
    best = max(statics, key=lambda x: x.tokens_per_s)
    adaptive = measured[Config(None, 0)]
    adaptive_tps = statistics.median(adaptive.tokens_per_s)
    ranked = [x for x in statics if x.predicted_t_eff_ms is not None and x.measured_t_eff_ms is not None]
    picks = held_out_picks([m.waves for c, m in measured.items() if c.chain is not None])
    held_out = units_rate(picks) if picks else None
    return RunResult(
        kind=kind, batch_size=batch, requests=requests,
        target_only_tokens_per_s=target_only.tokens_per_s,
        adaptive_tokens_per_s=adaptive_tps, adaptive_tokens_per_s_runs=adaptive.tokens_per_s,
        best_static=_best(best),
        adaptive_over_best_static=adaptive_tps / best.tokens_per_s,
        adaptive_over_target_only=adaptive_tps / target_only.tokens_per_s,
        adaptive_beats_every_static=adaptive_tps > max(x.tokens_per_s for x in statics),
        held_out_best_static_tokens_per_s=held_out,
        adaptive_over_held_out_best_static=adaptive_tps / held_out if held_out else None,
        adaptive_over_held_out_best_static_se=wave_ratio_se(adaptive.waves, picks) if picks else None,
        adaptive=_adaptive(adaptive),
        rank_correlation=spearman([x.predicted_t_eff_ms for x in ranked],
                                  [x.measured_t_eff_ms for x in ranked]) if len(ranked) > 2 else None,
        static=statics,
        speculative_static=sum(1 for x in statics if len(x.chain) > 1),
        acceptance=acceptance(adaptive.pairs))


def runoff_result(passes: int, per_pass: int, batch: int, measured: Mapping[Config, Measured],
                  screening_speed: Mapping[Config, float]) -> Runoff:
    """The run-off of one workload: ratios over the run-off's tokens and seconds alone. `measured` holds
    target-only, the finalist statics and adaptive last."""
    *finalists, adaptive = measured
    rate = {c: units_rate(m.waves) for c, m in measured.items()}
    # where the time went: the router's cycles (T_eff, ms per token of a row) and the rest of the
    # client's time per token (prefill, admission, the wave's wait for its last row); a configuration
    # that wins in its cycles and loses at the client loses outside them
    statics = [RunoffStatic(c.chain, c.window, rate[c], measured[c].tokens_per_s, screening_speed[c],
                            t_eff(measured[c]), outside_ms(measured[c], batch), cycles_by_rows(measured[c]))
               for c in finalists]
    best_config, best = max(zip(finalists, statics), key=lambda cx: cx[1].tokens_per_s)
    m = measured[adaptive]
    return Runoff(
        passes=passes, adaptive_tokens_per_s=rate[adaptive], adaptive_tokens_per_s_runs=m.tokens_per_s,
        adaptive_measured_t_eff_ms=t_eff(m), adaptive_outside_cycles_ms_per_token=outside_ms(m, batch),
        adaptive_per_config=choices(m.per_config), adaptive_cycles_by_rows=cycles_by_rows(m),
        adaptive_waves=wave_table(m, [measured[c] for c in finalists], per_pass),
        planning_ms_per_s={c.label(): x.planning_ms / sum(s for _, s in x.waves) for c, x in measured.items()},
        static=statics, best_static=_best(best),
        adaptive_over_best_static=rate[adaptive] / best.tokens_per_s,
        adaptive_over_best_static_se=wave_ratio_se(m.waves, measured[best_config].waves),
        adaptive_over_target_only=rate[adaptive] / rate[finalists[0]],
        adaptive_beats_every_static=rate[adaptive] > best.tokens_per_s)
