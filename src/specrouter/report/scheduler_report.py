"""`specrouter scheduler-report`: every static (chain, window) against the adaptive scheduler, side by side.

For each workload kind and batch size, the same requests run once per configuration, through a router:
target-only, every chain of the pool at every window asked for, and `auto` (the adaptive scheduler).
The requests go in waves of B (batch size B: B requests in flight together, batched by the router), and
every wave runs under every configuration before the next wave starts: `auto` first (so what it knows
of the workload comes from earlier waves, never from the same requests run statically), then the static
configurations in a shuffled order. Interleaving at this grain spreads every configuration's runs over
the whole measurement, so a machine that slows down for a while slows all of them alike. A configuration's
tokens per second are its tokens over its seconds summed over the waves; with `repeats` passes, the
median pass. One unmeasured `auto` run of the first wave comes first.

Measured per configuration: tokens per second at the client; T_eff measured at the router (its cycles'
wall time over the tokens they emitted per row, read from the router's ledgers before and after the run)
beside the scheduler's prediction for the same configuration taken just before the run; for adaptive
runs, the scheduler's predicted acceptance of every pair beside the realized one over the same cycles.
A static configuration's measured T_eff counts the cycles that ran at the run's batch size, as its
prediction does: the rows of a wave join and finish apart, and the cycles of the few rows left at the
end cost less per row (on the demo pool, window 8 at batch 4 spends 38% of its cycle time at batch 1
or 2), so over all cycles a long window looks as good as a short one that the clients measure 20%
faster. Both are reported.

A switching run sends the requests of one kind, then of another, as one stream; every static
configuration and the adaptive scheduler run it the same way.

The best of many configurations measured once is biased upwards: on a shared 2-core machine one
configuration measures 5-10% apart from one pass to the next, and among 17 statics several are within
that of each other, so the plain best is partly the luckiest. The run-off settles it: after the
screening passes, `runoff_passes` more passes run `auto`, target-only and the `runoff_top` fastest
statics of the screening (picked there, measured afresh, so the pick does not inflate the figure), again
wave by wave; the checks compare those. Both the screening and the run-off figures are reported.
Where the batch size leaves few waves (8 requests are 8 waves at batch 1 but 2 at batch 4), the run-off
takes more passes, until every configuration has run `runoff_waves` waves: two passes of two waves left
the ratio of one cell a draw (tables at batch 4 measured 0.91-1.03 in runs of the same code), and the
best of two statics measured on four waves is biased upwards by the luckier one.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from specrouter.client import Client
from specrouter.report.inflight import in_flight
from specrouter.report.workloads import Prompt
from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc

TARGET_ONLY, ADAPTIVE = "target", "auto"
REQUESTS = 8               # requests per workload and batch size (at least two waves of the batch size)
ACCEPTANCE_MIN_CHECKS = 200  # a pair is "in use" by the adaptive scheduler with at least this many checks


@dataclass(frozen=True)
class ReportSettings:
    batch_sizes: Sequence[int] = (1, 4, 16)
    windows: Sequence[int] = tuple(range(1, 9))
    max_new_tokens: int = 48
    repeats: int = 1
    requests: int = REQUESTS
    temperature: float = 0.0
    switching: tuple[str, str] | None = ("prose", "repetitive")
    switching_batch_sizes: Sequence[int] = (1,)
    seed: int = 1234
    runoff_passes: int = 2     # passes of auto, target-only and the top statics after screening (0: none)
    runoff_top: int = 2        # statics fastest in the screening that go to the run-off
    runoff_waves: int = 8      # more run-off passes where a pass has fewer waves than this (batch sizes > 1)
    switching_runoff_passes: int = 8   # run-off passes of a switching run, at least

    def runoff_passes_for(self, waves: int, switching: bool = False) -> int:
        """Run-off passes of a workload of `waves` waves: `runoff_passes`, or as many more as it takes to
        run `runoff_waves` waves; of a switching run, at least `switching_runoff_passes`. Its check is
        strict (adaptive faster than every static) between speeds a few percent apart, while one wave's
        ratio of adaptive over a static varies by about 16% (standard deviation of its log, one request
        at batch 1 on a 2-core machine): two passes of its 16 waves measured the ratio within about 2.8%
        (standard error), eight within about 1.4%."""
        if self.runoff_passes <= 0 or waves <= 0:
            return 0
        passes = max(self.runoff_passes, -(-self.runoff_waves // waves))
        return max(passes, self.switching_runoff_passes) if switching else passes


@dataclass(frozen=True)
class Config:
    chain: tuple[str, ...] | None   # None: adaptive
    window: int

    @property
    def spec(self) -> str:
        return ADAPTIVE if self.chain is None else ",".join(self.chain)

    def label(self) -> str:
        if self.chain is None:
            return "adaptive"
        return ",".join(self.chain) + (f" W{self.window}" if len(self.chain) > 1 else "")


@dataclass
class Measured:
    tokens_per_s: list[float] = field(default_factory=list)   # per pass
    tokens: int = 0                                            # of the current pass
    seconds: float = 0.0
    waves: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds) of every wave of every pass
    predicted_t_eff_ms: list[float] = field(default_factory=list)
    predicted_static: list[tuple[float, float]] = field(default_factory=list)  # (cycle ms, emitted) before each run
    cycle_ms: float = 0.0
    emitted: float = 0.0
    predicted_cycle_ms: float = 0.0
    predicted_emitted: float = 0.0
    cycles: int = 0
    # cycles that ran at the run's batch size (a wave's rows join and finish apart, so some run smaller):
    # [cycles, cycle ms, emitted] summed
    at_batch: list[float] = field(default_factory=lambda: [0.0] * 3)
    chain_counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    pairs: dict[tuple[str, str, str], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0] * 4))
    # adaptive, per (chain, window) it chose: [cycles, cycle ms, emitted, predicted cycle ms, predicted emitted]
    per_config: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0] * 5))
    planning_ms: float = 0.0    # the router's planner (and inline plans) while this configuration ran
    # per (chain and window run, rows in the cycle): [cycles, cycle ms, emitted]; a wave's tail runs fewer rows
    by_rows: dict[tuple[str, int], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0] * 3))
    # adaptive, per wave run (in the order of `waves`): per (chain, window) it chose, as in `per_config`
    wave_choices: list[dict[str, list[float]]] = field(default_factory=list)


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


class SchedulerReport:
    def __init__(self, router: str, settings: ReportSettings, say: Callable[[str], None] = lambda s: None):
        self.settings = settings
        self.client = Client(router, timeout_s=600)
        self.stub = router_pb2_grpc.RouterServiceStub(grpc.insecure_channel(router))
        self.say = say
        models = self.client.models()
        self.target = next(m.name for m in models if m.role == "target")
        self.models = [m.name for m in models]
        first = self.first = self.stub.Schedule(pb.ScheduleRequest(greedy_rows=1), timeout=60)
        self.first_at = time.perf_counter()
        self.chains = sorted({tuple(c.chain) for c in first.candidates if len(c.chain) > 1}, key=lambda c: (len(c), c))

    # -- one run --------------------------------------------------------------------------------

    def _schedule(self, batch: int) -> pb.ScheduleResponse:
        greedy, sampling = (batch, 0) if self.settings.temperature == 0 else (0, batch)
        return self.stub.Schedule(pb.ScheduleRequest(greedy_rows=greedy, sampling_rows=sampling), timeout=60)

    def _generate(self, config: Config, prompts: Sequence[str], batch: int, seed: int) -> tuple[int, float, list]:
        """All prompts, `batch` in flight at a time, in order: (tokens, seconds, results)."""
        params = dict(max_new_tokens=self.settings.max_new_tokens, temperature=self.settings.temperature,
                      chain=config.spec, window=config.window if config.chain is not None else 0)
        results, elapsed = in_flight(lambda i: self.client.generate(prompts[i], seed=seed + i, **params),
                                     len(prompts), batch)
        return sum(len(r.token_ids) for r in results), elapsed, results

    def _run(self, config: Config, prompts: Sequence[str], batch: int, into: Measured, seed: int) -> None:
        before = self._schedule(batch)
        if config.chain is not None:
            predicted = {(tuple(c.chain), c.window): c for c in before.candidates}
            c = predicted.get((config.chain, config.window if len(config.chain) > 1 else 0))
            if c is not None:
                into.predicted_t_eff_ms.append(c.predicted_t_eff_ms)
                into.predicted_static.append((c.predicted_cycle_ms, c.predicted_emitted))
        tokens, seconds, results = self._generate(config, prompts, batch, seed)
        after = self._schedule(batch)
        into.tokens += tokens
        into.seconds += seconds
        into.waves.append((tokens, seconds))
        into.planning_ms += after.planning_ms - before.planning_ms
        for r in results:
            for chain, n in r.stats.chain_counts.items():
                into.chain_counts[chain] += n
        adaptive = config.chain is None
        chosen = {label: list(v) for label, v in into.per_config.items()} if adaptive else {}
        self._diff_ledgers(config, before, after, into, batch)
        if adaptive:
            into.wave_choices.append({label: [x - y for x, y in zip(v, chosen.get(label, [0.0] * 5))]
                                      for label, v in into.per_config.items()
                                      if v[0] > chosen.get(label, [0.0])[0]})

    def _diff_ledgers(self, config: Config, before: pb.ScheduleResponse, after: pb.ScheduleResponse,
                      into: Measured, batch: int) -> None:
        def key(ledger):
            return tuple(ledger.chain), ledger.window, ledger.batch_size, ledger.adaptive

        old = {key(ledger): ledger for ledger in before.ledgers}
        for ledger in after.ledgers:
            chain, window, _, adaptive = key(ledger)
            if config.chain is None:
                if not adaptive:
                    continue
            elif adaptive or chain != config.chain or window != (config.window if len(chain) > 1 else 0):
                continue
            prev = old.get(key(ledger))
            delta = {name: getattr(ledger, name) - (getattr(prev, name) if prev else 0) for name in
                     ("cycles", "cycle_ms", "emitted", "predicted_cycle_ms", "predicted_emitted")}
            into.cycles += delta["cycles"]
            if ledger.batch_size == batch:
                for i, name in enumerate(("cycles", "cycle_ms", "emitted")):
                    into.at_batch[i] += delta[name]
            if delta["cycles"]:
                rows = into.by_rows[(Config(chain, window).label(), ledger.batch_size)]
                for i, name in enumerate(("cycles", "cycle_ms", "emitted")):
                    rows[i] += delta[name]
            if config.chain is None and delta["cycles"]:
                chosen = into.per_config[Config(chain, window).label()]
                for i, value in enumerate(delta.values()):
                    chosen[i] += value
            for name in ("cycle_ms", "emitted", "predicted_cycle_ms", "predicted_emitted"):
                setattr(into, name, getattr(into, name) + delta[name])
            prev_pairs = {(p.drafter, p.verifier, p.mode): p for p in prev.pairs} if prev else {}
            for p in ledger.pairs:
                q = prev_pairs.get((p.drafter, p.verifier, p.mode))
                entry = into.pairs[(p.drafter, p.verifier, p.mode)]
                for i, name in enumerate(("accepted", "checked", "predicted_accepted", "predicted_checked")):
                    entry[i] += getattr(p, name) - (getattr(q, name) if q else 0.0)

    # -- one workload at one batch size ---------------------------------------------------------

    def configs(self) -> list[Config]:
        statics = [Config(c, w) for c in self.chains for w in self.settings.windows]
        return [Config((self.target,), 0), *statics, Config(None, 0)]

    def workload(self, kind: str, prompts: Sequence[str], batch: int, step: Callable[[str], None]) -> dict:
        s = self.settings
        configs = self.configs()
        measured = {c: Measured() for c in configs}
        adaptive, statics = configs[-1], configs[:-1]
        waves = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
        self._generate(adaptive, waves[0], batch, s.seed)  # warm-up: the metrics learn this workload
        for repeat in range(s.repeats):
            self._pass(adaptive, statics, waves, batch, measured, repeat, f"{kind} B={batch}", step)
        summary = self._summarise(kind, batch, len(prompts), measured)
        if s.runoff_passes_for(len(waves), _is_switching(kind)) > 0:
            summary["runoff"] = self._runoff(kind, waves, batch, measured, step)
        return summary

    def _pass(self, adaptive: Config, statics: Sequence[Config], waves: Sequence[Sequence[str]], batch: int,
              measured: dict[Config, Measured], repeat: int, name: str, step: Callable[[str], None]) -> None:
        """One pass over the waves: per wave, `adaptive` first, then `statics` in a shuffled order."""
        s = self.settings
        rate = lambda c: measured[c].tokens / measured[c].seconds  # noqa: E731
        for i, wave in enumerate(waves):
            order = list(statics)
            random.Random(s.seed * 1_000_003 + repeat * 1009 + i).shuffle(order)
            for config in [adaptive, *order]:
                self._run(config, wave, batch, measured[config], s.seed + i * batch)
            best = max(statics, key=rate)
            step(f"{name} wave {i + 1}/{len(waves)}: adaptive {rate(adaptive):.1f} tok/s, best static "
                 f"{best.label()} {rate(best):.1f}, target-only {rate(statics[0]):.1f} (so far)")
        for m in measured.values():
            m.tokens_per_s.append(m.tokens / m.seconds)
            m.tokens, m.seconds = 0, 0.0

    def _runoff(self, kind: str, waves: Sequence[Sequence[str]], batch: int, screened: dict[Config, Measured],
                step: Callable[[str], None]) -> dict:
        """`runoff_passes` fresh passes of adaptive, target-only and the `runoff_top` fastest statics of the
        screening; ratios over the run-off's tokens and seconds alone."""
        s = self.settings
        configs = list(screened)
        adaptive, target_only = configs[-1], configs[0]
        speed = {c: statistics.median(m.tokens_per_s) for c, m in screened.items()}
        top = sorted(configs[1:-1], key=lambda c: -speed[c])[: s.runoff_top]
        finalists = [target_only, *top]
        measured = {c: Measured() for c in [*finalists, adaptive]}
        passes = s.runoff_passes_for(len(waves), _is_switching(kind))
        for repeat in range(passes):
            self._pass(adaptive, finalists, waves, batch, measured, s.repeats + repeat,
                       f"{kind} B={batch} run-off {repeat + 1}/{passes}", step)
        rate = {c: units_rate(m.waves) for c, m in measured.items()}
        # where the time went: the router's cycles (T_eff, ms per token of a row) and the rest of the
        # client's time per token (prefill, admission, the wave's wait for its last row); a configuration
        # that wins in its cycles and loses at the client loses outside them
        t_eff = {c: _t_eff(m) for c, m in measured.items()}
        outside = {c: _outside_ms(m, batch) for c, m in measured.items()}
        statics = [{"chain": list(c.chain), "window": c.window, "tokens_per_s": rate[c],
                    "tokens_per_s_runs": measured[c].tokens_per_s, "screening_tokens_per_s": speed[c],
                    "measured_t_eff_ms": t_eff[c], "outside_cycles_ms_per_token": outside[c],
                    "cycles_by_rows": _by_rows(measured[c])}
                   for c in finalists]
        best_config, best = max(zip(finalists, statics), key=lambda cx: cx[1]["tokens_per_s"])
        return {"passes": passes, "adaptive_tokens_per_s": rate[adaptive],
                "adaptive_tokens_per_s_runs": measured[adaptive].tokens_per_s,
                "adaptive_measured_t_eff_ms": t_eff[adaptive],
                "adaptive_outside_cycles_ms_per_token": outside[adaptive],
                "adaptive_per_config": _per_config(measured[adaptive]),
                "adaptive_cycles_by_rows": _by_rows(measured[adaptive]),
                "adaptive_waves": _waves(measured[adaptive], [measured[c] for c in finalists[1:]], len(waves)),
                # CPU the router spent planning per second of each configuration's runs: the planner shares
                # the machine with the workers, so what it spends slows adaptive's cycles
                "planning_ms_per_s": {c.label(): m.planning_ms / sum(x for _, x in m.waves)
                                      for c, m in measured.items()},
                "static": statics, "best_static": {k: best[k] for k in ("chain", "window", "tokens_per_s")},
                "adaptive_over_best_static": rate[adaptive] / best["tokens_per_s"],
                # how far that ratio is to be trusted: the standard error of its log, from the waves' ratios
                "adaptive_over_best_static_se": wave_ratio_se(
                    measured[adaptive].waves, measured[best_config].waves),
                "adaptive_over_target_only": rate[adaptive] / rate[target_only],
                "adaptive_beats_every_static": rate[adaptive] > best["tokens_per_s"]}

    def _summarise(self, kind: str, batch: int, requests: int, measured: dict[Config, Measured]) -> dict:
        def t_eff_at_batch(m: Measured) -> float | None:   # what the prediction, made for B rows, is about
            return m.at_batch[1] / m.at_batch[2] if m.at_batch[2] else _t_eff(m)

        statics = []
        for config, m in measured.items():
            if config.chain is None:
                continue
            predicted = m.predicted_t_eff_ms
            statics.append({"chain": list(config.chain), "window": config.window,
                            "tokens_per_s": statistics.median(m.tokens_per_s),
                            "tokens_per_s_runs": m.tokens_per_s,
                            "predicted_t_eff_ms": statistics.fmean(predicted) if predicted else None,
                            "measured_t_eff_ms": t_eff_at_batch(m), "cycles": m.cycles,
                            "measured_t_eff_all_cycles_ms": _t_eff(m), "cycles_at_batch_size": int(m.at_batch[0]),
                            "predicted_cycle_ms": statistics.fmean(c for c, _ in m.predicted_static)
                            if m.predicted_static else None,
                            "predicted_emitted": statistics.fmean(e for _, e in m.predicted_static)
                            if m.predicted_static else None,
                            "measured_cycle_ms": m.cycle_ms / m.cycles if m.cycles else None,
                            "measured_emitted": m.emitted / m.cycles if m.cycles else None})
        target_only = next(x for x in statics if len(x["chain"]) == 1)
        spec = [x for x in statics if len(x["chain"]) > 1]
        best = max(statics, key=lambda x: x["tokens_per_s"])
        adaptive = measured[Config(None, 0)]
        adaptive_tps = statistics.median(adaptive.tokens_per_s)
        ranked = [x for x in statics if x["predicted_t_eff_ms"] is not None and x["measured_t_eff_ms"] is not None]
        acceptance = _acceptance(adaptive.pairs)
        static_waves = [m.waves for c, m in measured.items() if c.chain is not None]
        picks = held_out_picks(static_waves)
        held_out = units_rate(picks) if picks else None
        return {
            "kind": kind, "batch_size": batch, "requests": requests,
            "target_only_tokens_per_s": target_only["tokens_per_s"],
            "adaptive_tokens_per_s": adaptive_tps,
            "adaptive_tokens_per_s_runs": adaptive.tokens_per_s,
            "best_static": {k: best[k] for k in ("chain", "window", "tokens_per_s")},
            "adaptive_over_best_static": adaptive_tps / best["tokens_per_s"],
            "adaptive_over_target_only": adaptive_tps / target_only["tokens_per_s"],
            "adaptive_beats_every_static": adaptive_tps > max(x["tokens_per_s"] for x in statics),
            # the best static as one picks it from data: per wave, the best of the other waves (no winner's curse)
            "held_out_best_static_tokens_per_s": held_out,
            "adaptive_over_held_out_best_static": adaptive_tps / held_out if held_out else None,
            # a diagnostic of the screening's pick, not a check: a unit is one wave, two at batch 4
            "adaptive_over_held_out_best_static_se": wave_ratio_se(adaptive.waves, picks) if picks else None,
            "adaptive": {"predicted_t_eff_ms": (adaptive.predicted_cycle_ms / adaptive.predicted_emitted
                                                if adaptive.predicted_emitted else None),
                         "measured_t_eff_ms": _t_eff(adaptive), "cycles": adaptive.cycles,
                         "measured_cycle_ms": adaptive.cycle_ms / adaptive.cycles if adaptive.cycles else None,
                         "measured_emitted": adaptive.emitted / adaptive.cycles if adaptive.cycles else None,
                         "chain_counts": dict(sorted(adaptive.chain_counts.items(), key=lambda kv: -kv[1])),
                         "cycles_per_config": {label: int(v[0]) for label, v in
                                               sorted(adaptive.per_config.items(), key=lambda kv: -kv[1][0])},
                         "per_config": _per_config(adaptive)},
            "rank_correlation": spearman([x["predicted_t_eff_ms"] for x in ranked],
                                         [x["measured_t_eff_ms"] for x in ranked]) if len(ranked) > 2 else None,
            "static": statics,
            "speculative_static": len(spec),
            "acceptance": acceptance,
        }

    # -- everything -----------------------------------------------------------------------------

    def run(self, prompts: Sequence[Prompt]) -> dict:
        s = self.settings
        kinds: dict[str, list[str]] = {}
        for p in prompts:
            kinds.setdefault(p.kind, []).append(p.prompt)
        plans = []
        for kind, texts in kinds.items():
            for batch in s.batch_sizes:
                plans.append((kind, _take(texts, _requests(s.requests, batch)), batch))
        if s.switching and all(k in kinds for k in s.switching):
            a, b = s.switching
            for batch in s.switching_batch_sizes:
                n = _requests(s.requests, batch)
                plans.append((f"switching:{a}>{b}", _take(kinds[a], n) + _take(kinds[b], n), batch))
        total = 0
        for kind, texts, batch in plans:
            waves = -(-len(texts) // batch)
            total += (s.repeats + s.runoff_passes_for(waves, _is_switching(kind))) * waves
        done = [0]
        started = time.perf_counter()

        def step(line: str) -> None:
            done[0] += 1
            left = (time.perf_counter() - started) / done[0] * (total - done[0])
            self.say(f"[{done[0]}/{total}, {left / 60:.1f} min left] {line}")

        runs = [self.workload(kind, texts, batch, step) for kind, texts, batch in plans]
        final = self._schedule(1)
        elapsed_ms = (time.perf_counter() - self.first_at) * 1e3
        cycles = sum(ledger.cycles for ledger in final.ledgers) - sum(ledger.cycles for ledger in self.first.ledgers)
        planning_ms = final.planning_ms - self.first.planning_ms
        pairs: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0] * 4)
        for run in runs:
            for a in run["acceptance"]:
                entry = pairs[(a["pair"][0], a["pair"][1], a["mode"])]
                for i, name in enumerate(("accepted", "checked", "predicted_accepted", "predicted_checked")):
                    entry[i] += a[name]
        correlations = [r["rank_correlation"] for r in runs if r["rank_correlation"] is not None]
        return {
            "runs": runs,
            "acceptance": _acceptance(pairs),
            "rank_correlation": {"mean": statistics.fmean(correlations) if correlations else None,
                                 "min": min(correlations) if correlations else None},
            "decision": {"decision_us": final.decision_us, "cycle_ms": final.cycle_ms,
                         "share_of_cycle": final.decision_us / 1e3 / final.cycle_ms if final.cycle_ms else None,
                         "decisions": final.decisions, "explorations": final.explorations,
                         "switches": final.switches,
                         # the planner's rankings, spread over every cycle the router ran meanwhile
                         "plans": final.plans - self.first.plans, "planning_ms": planning_ms,
                         # rankings asked for a shift not planned yet, which the nearest planned one served
                         "stand_ins": final.stand_ins - self.first.stand_ins,
                         "planning_ms_per_cycle": planning_ms / cycles if cycles else None,
                         "planning_share_of_time": planning_ms / elapsed_ms if elapsed_ms else None},
            "calibration": [{"mode": c.mode, "intercept": c.intercept, "slope": c.slope, "pairs": c.pairs}
                            for c in final.calibration],
            "settings": {"batch_sizes": list(s.batch_sizes), "windows": list(s.windows),
                         "max_new_tokens": s.max_new_tokens, "repeats": s.repeats, "temperature": s.temperature,
                         "runoff_passes": s.runoff_passes, "runoff_waves": s.runoff_waves, "runoff_top": s.runoff_top,
                         "switching_runoff_passes": s.switching_runoff_passes,
                         "models": self.models, "target": self.target},
            "checks": _checks(runs, _acceptance(pairs)),
        }


def held_out_picks(waves: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]] | None:
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


def held_out_best(waves: Sequence[Sequence[tuple[int, float]]]) -> float | None:
    """Tokens per second of the best static picked without looking at the wave it is measured on
    (`held_out_picks`, over every unit). None with fewer than two units."""
    picks = held_out_picks(waves)
    return None if picks is None else units_rate(picks)


def units_rate(units: Sequence[tuple[int, float]]) -> float:
    """Tokens per second over measured units, each (tokens, seconds)."""
    return sum(t for t, _ in units) / sum(s for _, s in units)


def wave_ratio_se(a: Sequence[tuple[int, float]], b: Sequence[tuple[int, float]]) -> float | None:
    """The standard error of the mean log ratio of the speeds of two configurations' waves, paired wave by
    wave ((tokens, seconds) each): about the relative standard error of the ratio of their speeds. None with
    fewer than two waves."""
    logs = [math.log((ta / sa) / (tb / sb)) for (ta, sa), (tb, sb) in zip(a, b) if min(ta, sa, tb, sb) > 0]
    if len(logs) < 2:
        return None
    return statistics.stdev(logs) / math.sqrt(len(logs))


def _t_eff(m: Measured) -> float | None:
    """The router's milliseconds of cycle per token of a row, over every cycle of the configuration."""
    return m.cycle_ms / m.emitted if m.emitted else None


def _per_config(m: Measured) -> dict[str, dict]:
    """Adaptive's choices: per (chain, window), predicted beside measured over the cycles it was chosen (a
    choice predicted faster than it measures is the optimism of picking the least of noisy estimates)."""
    return {label: {"cycles": int(n), "predicted_cycle_ms": pc / n, "measured_cycle_ms": c / n,
                    "predicted_emitted": pe / n, "measured_emitted": e / n}
            for label, (n, c, e, pc, pe) in sorted(m.per_config.items(), key=lambda kv: -kv[1][0])}


def _waves(adaptive: Measured, statics: Sequence[Measured], per_pass: int) -> list[dict]:
    """Adaptive wave by wave beside the statics' (every wave of every pass, in order: `wave` is its index
    in the pass): where it won and lost, and what it chose there (as `_per_config`)."""
    out = []
    for i, ((tokens, seconds), chosen) in enumerate(zip(adaptive.waves, adaptive.wave_choices)):
        m = Measured(per_config=defaultdict(lambda: [0.0] * 5, chosen))
        out.append({"wave": i % per_pass, "tokens_per_s": tokens / seconds,
                    "statics_tokens_per_s": [s.waves[i][0] / s.waves[i][1] for s in statics if len(s.waves) > i],
                    "choices": _per_config(m)})
    return out


def _by_rows(m: Measured) -> list[dict]:
    """The configuration's cycles per (chain and window run, rows in the cycle): how many, their mean
    cycle, and the tokens a row emitted in them. A wave's rows finish apart, so its last cycles run fewer
    rows; comparing two configurations' cycles at one (chain, window) means comparing them at equal rows."""
    return [{"config": label, "rows": rows, "cycles": int(n), "cycle_ms": c / n, "emitted": e / n,
             "ms_per_token": c / e if e else None}
            for (label, rows), (n, c, e) in sorted(m.by_rows.items(), key=lambda kv: (kv[0][0], -kv[0][1])) if n]


def _outside_ms(m: Measured, batch: int) -> float | None:
    """Client milliseconds per token not spent in the router's cycles: the client's time over its
    tokens, less the cycles' time over the tokens they emitted (per row; a wave's B rows in flight share
    each cycle)."""
    tokens = sum(t for t, _ in m.waves)
    if not tokens or not m.emitted:
        return None
    return sum(x for _, x in m.waves) * 1e3 / tokens - _t_eff(m) / batch


def _is_switching(kind: str) -> bool:
    return kind.startswith("switching:")


def _requests(requests: int, batch: int) -> int:
    """At least `requests`, in whole waves of `batch`, and at least two waves (for the held-out best)."""
    return -(-max(requests, 2 * batch) // batch) * batch


def _take(texts: Sequence[str], n: int) -> list[str]:
    return [texts[i % len(texts)] for i in range(n)]


def _acceptance(pairs: dict[tuple[str, str, str], list[float]]) -> list[dict]:
    out = []
    for (d, v, mode), (acc, checked, p_acc, p_checked) in sorted(pairs.items()):
        if checked <= 0:
            continue
        out.append({"pair": [d, v], "mode": mode, "realized": acc / checked,
                    "predicted": p_acc / p_checked if p_checked > 0 else None,
                    "accepted": acc, "checked": checked, "predicted_accepted": p_acc, "predicted_checked": p_checked,
                    "in_use": checked >= ACCEPTANCE_MIN_CHECKS})
    return out


def _checks(runs: list[dict], acceptance: list[dict]) -> dict:
    """The done-when checks; a run's run-off figures, where it has one, stand for it. A check with nothing
    to judge (no switching run, say) is None: not run, neither passed nor failed."""
    def decided(r: dict, key: str):
        return (r.get("runoff") or r)[key]

    def judged(items: list, ok) -> bool | None:
        return all(ok(x) for x in items) if items else None

    plain = [r for r in runs if not _is_switching(r["kind"])]
    switching = [r for r in runs if _is_switching(r["kind"])]
    in_use = [a for a in acceptance if a["in_use"] and a["predicted"] is not None]
    return {
        "adaptive_within_5pct_of_best_static": judged(plain, lambda r: decided(r, "adaptive_over_best_static") >= 0.95),
        "adaptive_at_most_3pct_slower_than_target_only": judged(
            plain, lambda r: decided(r, "adaptive_over_target_only") >= 0.97),
        "switching_adaptive_beats_every_static": judged(switching, lambda r: decided(r, "adaptive_beats_every_static")),
        "acceptance_within_0.05": judged(in_use, lambda a: abs(a["predicted"] - a["realized"]) <= 0.05),
    }


def format_report(report: dict) -> str:
    """The report as text: one block per run, then acceptance, rank correlation and the checks."""
    lines = []
    for r in report["runs"]:
        best = r["best_static"]
        lines.append(f"{r['kind']}  batch {r['batch_size']}  ({r['requests']} requests)")
        lines.append(f"  target-only {r['target_only_tokens_per_s']:8.1f} tok/s")
        lines.append(f"  best static {best['tokens_per_s']:8.1f} tok/s  {','.join(best['chain'])} W{best['window']}")
        a = r["adaptive"]
        lines.append(f"  adaptive    {r['adaptive_tokens_per_s']:8.1f} tok/s  = {r['adaptive_over_best_static']:.3f} x best"
                     f" static, {r['adaptive_over_target_only']:.3f} x target-only;"
                     f" T_eff predicted {_ms(a['predicted_t_eff_ms'])} measured {_ms(a['measured_t_eff_ms'])}")
        ro = r.get("runoff")
        if ro:
            rb = ro["best_static"]
            lines.append(f"  run-off ({ro['passes']} more passes of adaptive, target-only and the {len(ro['static']) - 1}"
                         f" fastest statics above): adaptive {ro['adaptive_tokens_per_s']:.1f} tok/s = "
                         f"{ro['adaptive_over_best_static']:.3f} x best static ({','.join(rb['chain'])} W{rb['window']} "
                         f"{rb['tokens_per_s']:.1f}), {ro['adaptive_over_target_only']:.3f} x target-only")
            if ro.get("adaptive_over_best_static_se") is not None:
                lines.append(f"    standard error of adaptive over the best static, from its waves' ratios: "
                             f"{ro['adaptive_over_best_static_se']:.3f}")
            best_ro = next(x for x in ro["static"] if (x["chain"], x["window"]) == (rb["chain"], rb["window"]))
            if ro.get("adaptive_measured_t_eff_ms") and best_ro.get("measured_t_eff_ms"):
                lines.append(f"    in the router's cycles: adaptive {_ms(ro['adaptive_measured_t_eff_ms'])} per token, "
                             f"best static {_ms(best_ro['measured_t_eff_ms'])}; outside them (prefill, admission, waits): "
                             f"{_ms(ro['adaptive_outside_cycles_ms_per_token'])} and "
                             f"{_ms(best_ro['outside_cycles_ms_per_token'])} per token")
            same = _same_cycles(ro.get("adaptive_cycles_by_rows", []), best_ro.get("cycles_by_rows", []), r["batch_size"])
            if same:
                lines.append(f"    at the best static's own configuration and {r['batch_size']} rows: adaptive "
                             f"{same[0]['cycle_ms']:.1f} ms a cycle, {same[0]['emitted']:.2f} tokens a row "
                             f"({same[0]['cycles']} cycles); the static {same[1]['cycle_ms']:.1f} ms, "
                             f"{same[1]['emitted']:.2f} ({same[1]['cycles']})")
            waves = [w["tokens_per_s"] / max(w["statics_tokens_per_s"]) for w in ro.get("adaptive_waves", [])
                     if w["statics_tokens_per_s"]]
            if waves:
                lines.append("    wave by wave, adaptive over the fastest static in the same wave: "
                             + " ".join(f"{x:.2f}" for x in waves))
            planning = ro.get("planning_ms_per_s", {})
            if planning:
                others = [v for k, v in planning.items() if k != "adaptive"]
                lines.append(f"    planning: {planning.get('adaptive', 0):.1f} ms per second of adaptive's runs, "
                             f"{max(others, default=0):.1f} at most in the others'")
            _print_choices(lines, "    adaptive chose in the run-off", ro.get("adaptive_per_config", {}))
        if r["adaptive_over_held_out_best_static"] is not None:
            se = r.get("adaptive_over_held_out_best_static_se")
            lines.append(f"  held-out best static {r['held_out_best_static_tokens_per_s']:8.1f} tok/s (picked on the other "
                         f"waves): adaptive = {r['adaptive_over_held_out_best_static']:.3f} x"
                         + (f", standard error {se:.3f}" if se is not None else "")
                         + " (the screening's pick; the run-off is checked)")
        _print_choices(lines, "  adaptive chose", a.get("per_config", {}))
        rho = r["rank_correlation"]
        lines.append(f"  rank correlation (predicted vs measured T_eff, {len(r['static'])} static): "
                     f"{'n/a' if rho is None else f'{rho:.3f}'}")
        top = sorted(r["static"], key=lambda x: -x["tokens_per_s"])[:5]
        for x in top:
            lines.append(f"    {','.join(x['chain']):<36} W{x['window']}  {x['tokens_per_s']:8.1f} tok/s  "
                         f"T_eff predicted {_ms(x['predicted_t_eff_ms'])} measured {_ms(x['measured_t_eff_ms'])}")
    lines.append("acceptance (adaptive cycles): pair, mode, predicted, realized, checks")
    for a in report["acceptance"]:
        pred = "n/a" if a["predicted"] is None else f"{a['predicted']:.3f}"
        lines.append(f"  {a['pair'][0]} -> {a['pair'][1]:<14} {a['mode']:<8} {pred}  {a['realized']:.3f}  "
                     f"{a['checked']:.0f}{'' if a['in_use'] else ' (not in use)'}")
    d = report["decision"]
    lines.append(f"decision {d['decision_us']:.1f} us per cycle of {d['cycle_ms']:.2f} ms "
                 f"({100 * (d['share_of_cycle'] or 0):.2f}%); {d['explorations']} explorations and "
                 f"{d['switches']} switches in {d['decisions']} decisions")
    if d.get("planning_ms_per_cycle") is not None:
        lines.append(f"planning {d['plans']} rankings, {d['planning_ms']:.0f} ms: {d['planning_ms_per_cycle']:.2f} ms per "
                     f"cycle, {100 * d['planning_share_of_time']:.2f}% of the router's wall time"
                     + (f"; {d['stand_ins']} asked before they were planned" if d.get("stand_ins") is not None else ""))
    rc = report["rank_correlation"]
    if rc["mean"] is not None:
        lines.append(f"rank correlation: mean {rc['mean']:.3f}, min {rc['min']:.3f}")
    for name, ok in report["checks"].items():
        lines.append(f"{'n/a ' if ok is None else 'PASS' if ok else 'FAIL'}  {name}")
    return "\n".join(lines)


def _print_choices(lines: list[str], title: str, per_config: dict[str, dict]) -> None:
    lines.append(f"{title} (cycles: cycle ms and tokens emitted, predicted -> measured):")
    indent = " " * (len(title) - len(title.lstrip()) + 2)
    for label, c in sorted(per_config.items(), key=lambda kv: -kv[1]["cycles"]):
        lines.append(f"{indent}{label:<40} {c['cycles']:4d}: {c['predicted_cycle_ms']:6.1f} -> "
                     f"{c['measured_cycle_ms']:6.1f} ms, {c['predicted_emitted']:.2f} -> {c['measured_emitted']:.2f}")


def _same_cycles(adaptive: Sequence[dict], static: Sequence[dict], rows: int) -> tuple[dict, dict] | None:
    """Adaptive's and a static's cycles at the static's configuration with `rows` rows, if both ran some."""
    static_cycles = next((c for c in static if c["rows"] == rows), None)
    if static_cycles is None:
        return None
    same = next((c for c in adaptive if c["rows"] == rows and c["config"] == static_cycles["config"]), None)
    return None if same is None else (same, static_cycles)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def log_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
