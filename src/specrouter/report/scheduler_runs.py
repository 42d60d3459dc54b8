"""The scheduler report's runner: drives a router over gRPC through the experiment and records what it measured.

Per workload and batch size it runs the screening passes and the run-off (the design is in
`scheduler_report`), reading the router's cycle ledgers before and after every run to attribute its
cycles, and the scheduler's predictions just before; `scheduler_stats` turns what it measured into records.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import grpc

from specrouter.client import Client
from specrouter.report.inflight import in_flight
from specrouter.report.machine import machine_line
from specrouter.report.scheduler_checks import checks
from specrouter.report.scheduler_results import (Calibration, Config, Decision, Report, Runoff, RunResult,
                                                 SettingsRecord, is_switching, switching_kind, to_json)
from specrouter.report.scheduler_stats import (AcceptanceTally, LedgerSum, Measured, overall_acceptance,
                                               rank_correlation, runoff_result, screening_result)
from specrouter.report.workloads import Prompt
from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc

REQUESTS = 8               # requests per workload and batch size (at least two waves of the batch size)
SCHEDULE_TIMEOUT_S = 60
CLIENT_TIMEOUT_S = 600
SEED_STRIDE_SETTINGS, SEED_STRIDE_PASS = 1_000_003, 1009   # the shuffle of a wave's statics


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
        run `runoff_waves` waves; of a switching run, at least `switching_runoff_passes`. The switching
        check is strict (adaptive faster than every static) between speeds a few percent apart, while the
        ratio of adaptive over a static varies much more from one wave to the next, so its standard error
        needs many waves to shrink below that gap."""
        if self.runoff_passes <= 0 or waves <= 0:
            return 0
        passes = max(self.runoff_passes, -(-self.runoff_waves // waves))
        return max(passes, self.switching_runoff_passes) if switching else passes

    def record(self, models: list[str], target: str) -> SettingsRecord:
        return SettingsRecord(list(self.batch_sizes), list(self.windows), self.max_new_tokens, self.repeats,
                              self.temperature, self.runoff_passes, self.runoff_waves, self.runoff_top,
                              self.switching_runoff_passes, models, target)


def requests_in_waves(requests: int, batch: int) -> int:
    """At least `requests`, in whole waves of `batch`, and at least two waves (for the held-out best)."""
    return -(-max(requests, 2 * batch) // batch) * batch


def _take(texts: Sequence[str], n: int) -> list[str]:
    return [texts[i % len(texts)] for i in range(n)]


def _ledger_key(ledger: pb.CycleLedger) -> tuple[tuple[str, ...], int, int, bool]:
    return tuple(ledger.chain), ledger.window, ledger.batch_size, ledger.adaptive


def _ledger_sum(ledger: pb.CycleLedger | None) -> LedgerSum:
    if ledger is None:
        return LedgerSum()
    return LedgerSum(ledger.cycles, ledger.cycle_ms, ledger.emitted, ledger.predicted_cycle_ms,
                     ledger.predicted_emitted)


def _tally(pair: pb.PairLedger | None) -> AcceptanceTally:
    if pair is None:
        return AcceptanceTally()
    return AcceptanceTally(pair.accepted, pair.checked, pair.predicted_accepted, pair.predicted_checked)


def _counts(config: Config, chain: tuple[str, ...], window: int, adaptive: bool) -> bool:
    """Whether a ledger of (chain, window, adaptive) holds cycles of `config`: adaptive's are every adaptive
    ledger; a static's, its own chain and window."""
    if config.chain is None:
        return adaptive
    return not adaptive and chain == config.chain and window == config.run_window


class SchedulerReport:
    def __init__(self, router: str, settings: ReportSettings, say: Callable[[str], None] = lambda s: None):
        self.settings = settings
        self.client = Client(router, timeout_s=CLIENT_TIMEOUT_S)
        self.stub = router_pb2_grpc.RouterServiceStub(grpc.insecure_channel(router))
        self.say = say
        models = self.client.models()
        self.target = next(m.name for m in models if m.role == "target")
        self.models = [m.name for m in models]
        first = self.first = self.stub.Schedule(pb.ScheduleRequest(greedy_rows=1), timeout=SCHEDULE_TIMEOUT_S)
        self.first_at = time.perf_counter()
        self.chains = sorted({tuple(c.chain) for c in first.candidates if len(c.chain) > 1}, key=lambda c: (len(c), c))

    # -- one run --------------------------------------------------------------------------------

    def _schedule(self, batch: int) -> pb.ScheduleResponse:
        greedy, sampling = (batch, 0) if self.settings.temperature == 0 else (0, batch)
        return self.stub.Schedule(pb.ScheduleRequest(greedy_rows=greedy, sampling_rows=sampling),
                                  timeout=SCHEDULE_TIMEOUT_S)

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
            c = predicted.get((config.chain, config.run_window))
            if c is not None:
                into.predicted_t_eff_ms.append(c.predicted_t_eff_ms)
                into.predicted_static.append((c.predicted_cycle_ms, c.predicted_emitted))
        tokens, seconds, results = self._generate(config, prompts, batch, seed)
        after = self._schedule(batch)
        into.add_wave(tokens, seconds)
        into.planning_ms += after.planning_ms - before.planning_ms
        for r in results:
            for chain, n in r.stats.chain_counts.items():
                into.chain_counts[chain] += n
        adaptive = config.chain is None
        chosen = {label: replace(s) for label, s in into.per_config.items()} if adaptive else {}
        self._diff_ledgers(config, before, after, into, batch)
        if adaptive:
            into.wave_choices.append({label: s.minus(chosen.get(label, LedgerSum()))
                                      for label, s in into.per_config.items()
                                      if s.cycles > chosen.get(label, LedgerSum()).cycles})

    def _diff_ledgers(self, config: Config, before: pb.ScheduleResponse, after: pb.ScheduleResponse,
                      into: Measured, batch: int) -> None:
        """Adds the cycles of `config` that the ledgers gained between `before` and `after` to `into`."""
        old = {_ledger_key(ledger): ledger for ledger in before.ledgers}
        for ledger in after.ledgers:
            chain, window, rows, adaptive = _ledger_key(ledger)
            if not _counts(config, chain, window, adaptive):
                continue
            prev = old.get(_ledger_key(ledger))
            delta = _ledger_sum(ledger).minus(_ledger_sum(prev))
            into.total.add(delta)
            if rows == batch:
                into.at_batch.add(delta)
            if delta.cycles:
                label = Config(chain, window).label()
                into.by_rows[(label, rows)].add(delta)
                if config.chain is None:
                    into.per_config[label].add(delta)
            prev_pairs = {(p.drafter, p.verifier, p.mode): p for p in prev.pairs} if prev else {}
            for p in ledger.pairs:
                key = (p.drafter, p.verifier, p.mode)
                into.pairs[key].add(_tally(p).minus(_tally(prev_pairs.get(key))))

    # -- one workload at one batch size ---------------------------------------------------------

    def configs(self) -> list[Config]:
        """Target-only, every static (chain, window), adaptive last."""
        statics = [Config(c, w) for c in self.chains for w in self.settings.windows]
        return [Config((self.target,), 0), *statics, Config(None, 0)]

    def workload(self, kind: str, prompts: Sequence[str], batch: int, step: Callable[[str], None]) -> RunResult:
        s = self.settings
        configs = self.configs()
        measured = {c: Measured() for c in configs}
        adaptive, statics = configs[-1], configs[:-1]
        waves = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
        self._generate(adaptive, waves[0], batch, s.seed)  # warm-up: the metrics learn this workload
        for repeat in range(s.repeats):
            self._pass(adaptive, statics, waves, batch, measured, repeat, f"{kind} B={batch}", step)
        result = screening_result(kind, batch, len(prompts), measured)
        if s.runoff_passes_for(len(waves), is_switching(kind)) > 0:
            result = replace(result, runoff=self._runoff(kind, waves, batch, measured, step))
        return result

    def _pass(self, adaptive: Config, statics: Sequence[Config], waves: Sequence[Sequence[str]], batch: int,
              measured: dict[Config, Measured], repeat: int, name: str, step: Callable[[str], None]) -> None:
        """One pass over the waves: per wave, `adaptive` first, then `statics` in a shuffled order."""
        s = self.settings
        for i, wave in enumerate(waves):
            order = list(statics)
            random.Random(s.seed * SEED_STRIDE_SETTINGS + repeat * SEED_STRIDE_PASS + i).shuffle(order)
            for config in [adaptive, *order]:
                self._run(config, wave, batch, measured[config], s.seed + i * batch)
            best = max(statics, key=lambda c: measured[c].rate())
            step(f"{name} wave {i + 1}/{len(waves)}: adaptive {measured[adaptive].rate():.1f} tok/s, best static "
                 f"{best.label()} {measured[best].rate():.1f}, target-only {measured[statics[0]].rate():.1f} (so far)")
        for m in measured.values():
            m.end_pass()

    def _runoff(self, kind: str, waves: Sequence[Sequence[str]], batch: int, screened: dict[Config, Measured],
                step: Callable[[str], None]) -> Runoff:
        """`runoff_passes` fresh passes of adaptive, target-only and the `runoff_top` fastest statics of the
        screening."""
        s = self.settings
        configs = list(screened)
        adaptive, target_only = configs[-1], configs[0]
        speed = {c: statistics.median(m.tokens_per_s) for c, m in screened.items()}
        top = sorted(configs[1:-1], key=lambda c: -speed[c])[: s.runoff_top]
        finalists = [target_only, *top]
        measured = {c: Measured() for c in [*finalists, adaptive]}
        passes = s.runoff_passes_for(len(waves), is_switching(kind))
        for repeat in range(passes):
            self._pass(adaptive, finalists, waves, batch, measured, s.repeats + repeat,
                       f"{kind} B={batch} run-off {repeat + 1}/{passes}", step)
        return runoff_result(passes, len(waves), batch, measured, speed)

    # -- everything -----------------------------------------------------------------------------

    def _plans(self, prompts: Sequence[Prompt]) -> list[tuple[str, list[str], int]]:
        """(kind, prompts, batch size) of every run: each kind at each batch size, then the switching run."""
        s = self.settings
        kinds: dict[str, list[str]] = {}
        for p in prompts:
            kinds.setdefault(p.kind, []).append(p.prompt)
        plans = []
        for kind, texts in kinds.items():
            for batch in s.batch_sizes:
                plans.append((kind, _take(texts, requests_in_waves(s.requests, batch)), batch))
        if s.switching and all(k in kinds for k in s.switching):
            a, b = s.switching
            for batch in s.switching_batch_sizes:
                n = requests_in_waves(s.requests, batch)
                plans.append((switching_kind(a, b), _take(kinds[a], n) + _take(kinds[b], n), batch))
        return plans

    def measure(self, prompts: Sequence[Prompt]) -> Report:
        s = self.settings
        plans = self._plans(prompts)
        total = 0
        for kind, texts, batch in plans:
            waves = -(-len(texts) // batch)
            total += (s.repeats + s.runoff_passes_for(waves, is_switching(kind))) * waves
        done = [0]
        started = time.perf_counter()

        def step(line: str) -> None:
            done[0] += 1
            left = (time.perf_counter() - started) / done[0] * (total - done[0])
            self.say(f"[{done[0]}/{total}, {left / 60:.1f} min left] {line}")

        runs = [self.workload(kind, texts, batch, step) for kind, texts, batch in plans]
        final = self._schedule(1)
        elapsed_ms = (time.perf_counter() - self.first_at) * 1e3
        acceptance = overall_acceptance(runs)
        return Report(runs=runs, acceptance=acceptance, rank_correlation=rank_correlation(runs),
                      decision=_decision(self.first, final, elapsed_ms),
                      calibration=[Calibration(c.mode, c.intercept, c.slope, c.pairs) for c in final.calibration],
                      settings=s.record(self.models, self.target),
                      checks=checks([r.outcome() for r in runs], acceptance), machine=machine_line())

    def run(self, prompts: Sequence[Prompt]) -> dict:
        """The report as `report.json` holds it."""
        return to_json(self.measure(prompts))


def _decision(first: pb.ScheduleResponse, final: pb.ScheduleResponse, elapsed_ms: float) -> Decision:
    """The router's decision and planning costs between two of its schedule replies `elapsed_ms` apart."""
    cycles = sum(ledger.cycles for ledger in final.ledgers) - sum(ledger.cycles for ledger in first.ledgers)
    planning_ms = final.planning_ms - first.planning_ms
    return Decision(
        decision_us=final.decision_us, cycle_ms=final.cycle_ms,
        share_of_cycle=final.decision_us / 1e3 / final.cycle_ms if final.cycle_ms else None,
        decisions=final.decisions, explorations=final.explorations, switches=final.switches,
        plans=final.plans - first.plans, planning_ms=planning_ms, stand_ins=final.stand_ins - first.stand_ins,
        planning_ms_per_cycle=planning_ms / cycles if cycles else None,
        planning_share_of_time=planning_ms / elapsed_ms if elapsed_ms else None)
