"""`specrouter bench`: SpecRouter through its services against transformers in one process (Table 2).

Per workload kind and batch size (a cell), the same prompts run under every configuration:

- through the services (the SDK client; at batch B, B requests in flight from B threads): target-only
  (TMO); the smallest drafter and the target at its best window (SSD-smallest); the best static
  two-level chain and window (SSD-tuned); every model smallest first at one window (three-level); the
  router's lookup level before the target (lookup), and before the smallest drafter and the target
  (lookup-three-level), where the router has it; and the adaptive scheduler
  (chain `auto`);
- in this process with transformers (`peers`): target-only `generate` at batch 1 (every ratio's
  reference), assisted generation with each drafter and prompt lookup (batch 1), and batched target-only
  `generate` at B > 1 (the reference of those cells);
- in this process on SpecRouter's own engine (`bench_in_process`: the router's chain step over the
  pool's worker engines, waves of B rows in one batch): the chain and window of TMO, SSD-tuned and
  three-level, each beside its services twin, so that every cell prints what the services keep of the
  engine.

The design, in order per cell:
1. warm-up: one unmeasured adaptive run of the first wave, so its metrics know the workload;
2. screening: every two-level chain at every window once, over the first `screening_waves` waves; it
   picks SSD-smallest and SSD-tuned, is reported and is not counted;
3. `rounds` interleaved rounds: each runs every configuration (the engine's rows too, at the chains and
   windows the screening picked) once over all of the cell's prompts, in an
   order shuffled per round (a machine that slows for a while slows every configuration alike); tokens/s
   of a run is its generated tokens over its wall seconds; the median and range over rounds are kept;
4. run-off, at batch sizes above 1: `runoff_rounds` more rounds of adaptive and the static configuration
   fastest over the rounds, alternating (`Runoff`). The fastest of six configurations measured three times
   is picked for its luck too; measured again beside adaptive it is not, and the batched cells' check
   (adaptive at least 0.97x the best static) reads the run-off.

Every services and engine run's greedy tokens are compared with TMO's, prompt by prompt (the engine runs
the same target); the peers' agreement with TMO is counted, not checked (a reduction of another shape
may flip a near tie in fp32).
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specrouter.client import Client
from specrouter.report.bench_in_process import InProcessRows, Run
from specrouter.report.bench_results import (
    ADAPTIVE, ENGINE, ENGINE_TWINS, HF_PROMPT_LOOKUP, HF_TARGET, IN_PROCESS, LOOKUP_CHAIN, LOOKUP_THREE_LEVEL,
    SERVICES, SSD_SMALLEST,
    SSD_TUNED, THREE_LEVEL, TMO, Breakdown, BreakdownSum, Cell, Check, Entry, Mismatch, Runoff, Screened, Spread,
    agreeing, assisted_label, engine_label, evaluate_checks, find_mismatches, set_ratios, tokens_per_s)
from specrouter.report.inflight import in_flight
from specrouter.report.machine import machine_line
from specrouter.report.scheduler_results import Config as ServiceConfig   # (chain or None for adaptive, window)
from specrouter.report.workloads import Prompt, by_kind
from specrouter.router.lookup import LOOKUP

SWITCHING = "switching"
DEFAULT_KINDS = ("code", "repetitive", "prose", SWITCHING)
SWITCHING_PAIR = ("prose", "repetitive")   # a run of prose requests, then repetitive ones
CLIENT_TIMEOUT_S = 600.0
SEED_STRIDE_ROUND, SEED_STRIDE_CELL = 1009, 1_000_003


@dataclass(frozen=True)
class BenchSettings:
    kinds: Sequence[str] = DEFAULT_KINDS
    batch_sizes: Sequence[int] = (1, 4, 16)
    requests: int = 8                 # per kind and batch size: at least two waves, in whole waves
    max_new_tokens: int = 64
    rounds: int = 3
    windows: Sequence[int] = (2, 3, 4, 5, 6)
    three_level_window: int = 4
    lookup_window: int = 8            # of the lookup chain (lookup -> target), where the router has the level
    screening_waves: int = 2          # waves of a cell the screening runs over
    runoff_rounds: int = 8            # at batch sizes above 1: rounds of adaptive and the best static after the
                                      # rounds, alternating (0: no run-off)
    seed: int = 1234
    device: str = "cpu"               # where the local cluster's workers and the in-process rows run
    dtype: str = "float32"
    models_in_router: bool = False    # the local cluster's router holds the models (no worker processes)


@dataclass(frozen=True)
class Workload:
    kind: str
    batch_size: int
    prompts: list[str]
    ids: list[list[int]]              # the prompts as the router encodes them

    @property
    def waves(self) -> int:
        return -(-len(self.prompts) // self.batch_size)


@dataclass(frozen=True)
class ModelRow:
    name: str
    parameters: int
    role: str


@dataclass
class BenchReport:
    settings: BenchSettings
    models: list[ModelRow]
    cells: list[Cell]
    mismatches: list[Mismatch]
    checks: list[Check]
    seconds: float
    machine: str = ""   # report.machine.machine_line() of the machine that ran it


class BenchError(ValueError):
    """The bench cannot run as asked (a router serving another pool, kinds with no prompts)."""


def requests_for(requests: int, batch: int) -> int:
    """At least `requests` and two waves of `batch`, in whole waves."""
    return -(-max(requests, 2 * batch) // batch) * batch


def _take(texts: Sequence[str], n: int) -> list[str]:
    return [texts[i % len(texts)] for i in range(n)]


def check_kinds(prompts: Sequence[Prompt], kinds: Sequence[str]) -> None:
    """Raises BenchError naming the asked kinds that the prompts do not hold."""
    have = {p.kind for p in prompts}
    missing = [k for k in kinds if k not in have and not (k == SWITCHING and set(SWITCHING_PAIR) <= have)]
    if missing:
        raise BenchError(f"no prompts of kind {', '.join(missing)}: the prompts hold {', '.join(sorted(have))}"
                         f" ({SWITCHING} needs {' and '.join(SWITCHING_PAIR)})")


def workloads(prompts: Sequence[Prompt], settings: BenchSettings, encode: Callable[[str], list[int]]) -> list[Workload]:
    """The cells to run: every asked kind at every batch size, kinds in the order asked."""
    check_kinds(prompts, settings.kinds)
    texts = {kind: [p.prompt for p in group] for kind, group in by_kind(prompts).items()}
    cells = []
    for kind in settings.kinds:
        for batch in settings.batch_sizes:
            n = requests_for(settings.requests, batch)
            chosen = (_take(texts[SWITCHING_PAIR[0]], n) + _take(texts[SWITCHING_PAIR[1]], n) if kind == SWITCHING
                      else _take(texts[kind], n))
            cells.append(Workload(kind, batch, chosen, [encode(p) for p in chosen]))
    return cells


class Progress:
    """Generate waves done out of a total that the screening may lower; no output (see `RichProgress`)."""

    def start(self, total: int) -> None: ...

    def advance(self, waves: int, description: str) -> None: ...

    def lower_total(self, waves: int) -> None: ...


class Bench:
    """Runs the cells against a router and the pool's models in this process."""

    def __init__(self, router: str, local: InProcessRows, settings: BenchSettings, progress: Progress = Progress()):
        self.settings, self.local, self.progress = settings, local, progress
        peers = local.peers
        self.client = Client(router, timeout_s=CLIENT_TIMEOUT_S)
        listed = self.client.models(levels=True)
        found = [m for m in listed if m.role != "lookup"]
        self.models = [ModelRow(m.name, m.parameters, m.role) for m in sorted(found, key=lambda m: m.parameters)]
        target = next((m.name for m in found if m.role == "target"), None)
        if target != peers.target or {m.name for m in found} != set(peers.models):
            raise BenchError(f"the router serves {sorted(m.name for m in found)} (target {target}), the pool "
                             f"{sorted(peers.models)} (target {peers.target}); give --pool the router's pool")
        self.target = target
        self.drafters = [m.name for m in self.models if m.name != target]
        self.lookup = next((m.name for m in listed if m.name == LOOKUP), None)

    # -- the configurations -------------------------------------------------------------------

    def two_level(self) -> list[ServiceConfig]:
        return [ServiceConfig((d, self.target), w) for d in self.drafters for w in self.settings.windows]

    def three_level(self) -> ServiceConfig | None:
        """Every drafter, smallest first, then the target (with fewer than two drafters: none)."""
        if len(self.drafters) < 2:
            return None
        return ServiceConfig((*self.drafters, self.target), self.settings.three_level_window)

    def plan(self, screened: Sequence[Screened]) -> dict[str, ServiceConfig]:
        """The services configurations, by label, given the screening's speeds."""
        plan = {TMO: ServiceConfig((self.target,), 0)}
        if screened:
            best = max(screened, key=lambda s: s.tokens_per_s)
            smallest = [s for s in screened if s.chain[0] == self.drafters[0]]
            pick = max(smallest, key=lambda s: s.tokens_per_s)
            plan[SSD_SMALLEST] = ServiceConfig(tuple(pick.chain), pick.window)
            plan[SSD_TUNED] = ServiceConfig(tuple(best.chain), best.window)
        if self.three_level() is not None:
            plan[THREE_LEVEL] = self.three_level()
        if self.lookup is not None:
            plan[LOOKUP_CHAIN] = ServiceConfig((self.lookup, self.target), self.settings.lookup_window)
            if self.drafters:   # the smallest drafter checks and extends what the lookup copies
                plan[LOOKUP_THREE_LEVEL] = ServiceConfig((self.lookup, self.drafters[0], self.target),
                                                         self.settings.lookup_window)
        plan[ADAPTIVE] = ServiceConfig(None, 0)
        return plan

    def planned_labels(self) -> int:
        """Services configurations of a cell before the screening's picks are deduplicated."""
        lookup = 0 if self.lookup is None else 1 + bool(self.drafters)
        return 2 + (2 if self.drafters else 0) + (self.three_level() is not None) + lookup

    def planned_engine_rows(self) -> int:
        """Engine-in-process twins of a cell before the screening: TMO's, SSD-tuned's, three-level's."""
        return 1 + bool(self.drafters) + (self.three_level() is not None)

    @staticmethod
    def engine_plan(plan: dict[str, ServiceConfig]) -> dict[str, ServiceConfig]:
        """The engine-in-process rows, by label: the chain and window of each planned twin."""
        return {engine_label(label): plan[label] for label in ENGINE_TWINS if label in plan}

    def peer_labels(self, batch: int) -> list[str]:
        if batch > 1:
            return [HF_TARGET]
        return [HF_TARGET, *(assisted_label(d) for d in self.drafters), HF_PROMPT_LOOKUP]

    def planned_waves(self, w: Workload) -> int:
        """Generate waves of a cell before the screening dedupes: warm-up, screening, rounds."""
        screening = len(self.two_level()) * min(w.waves, self.settings.screening_waves)
        services = self.planned_labels() + self.planned_engine_rows()   # the engine's rows run in waves too
        peer = len(w.prompts) * len(self.peer_labels(1)) if w.batch_size == 1 else w.waves
        return 1 + screening + self.settings.rounds * (services * w.waves + peer) + self.runoff_waves(w)

    def runoff_waves(self, w: Workload) -> int:
        """Generate waves of a cell's run-off: two configurations a round, at batch sizes above 1."""
        return 2 * self.settings.runoff_rounds * w.waves if w.batch_size > 1 else 0

    # -- running ------------------------------------------------------------------------------

    def services(self, config: ServiceConfig, prompts: Sequence[str], batch: int) -> Run:
        """All prompts, `batch` requests in flight at a time (a thread each), in order."""
        params = dict(max_new_tokens=self.settings.max_new_tokens, temperature=0.0, chain=config.spec,
                      window=config.window)
        def one(i: int):
            started = time.perf_counter_ns()
            result = self.client.generate(prompts[i], **params)
            return result, time.perf_counter_ns() - started

        results, seconds = in_flight(one, len(prompts), batch)
        outputs = [r.token_ids for r, _ in results]
        return Run(sum(len(o) for o in outputs), seconds, outputs, [(r.stats, ns) for r, ns in results])

    def screen(self, w: Workload, runs: dict[str, list[list[list[int]]]]) -> list[Screened]:
        """Every two-level chain at every window once over the first waves; outputs kept for the check."""
        prompts = w.prompts[: self.settings.screening_waves * w.batch_size]
        screened = []
        for config in self.two_level():
            run = self.services(config, prompts, w.batch_size)
            runs.setdefault(f"screening {config.spec} W{config.window}", []).append(run.outputs)
            screened.append(Screened(list(config.chain), config.window, tokens_per_s(run.tokens, run.seconds)))
            self.progress.advance(-(-len(prompts) // w.batch_size), f"{w.kind} B={w.batch_size} screening")
        return screened

    def cell(self, w: Workload, index: int) -> tuple[Cell, list[Mismatch]]:
        s = self.settings
        runs: dict[str, list[list[list[int]]]] = {}
        warm = self.services(ServiceConfig(None, 0), w.prompts[: w.batch_size], w.batch_size)
        runs["adaptive (warm-up)"] = [warm.outputs]
        self.progress.advance(1, f"{w.kind} B={w.batch_size} warm-up")
        screened = self.screen(w, runs)
        plan = self.plan(screened)
        distinct, engine = list(dict.fromkeys(plan.values())), self.engine_plan(plan)
        unplanned = self.planned_labels() + self.planned_engine_rows() - len(distinct) - len(engine)
        self.progress.lower_total(s.rounds * unplanned * w.waves)
        labels = [*distinct, *engine, *self.peer_labels(w.batch_size)]
        measured: dict[object, list[Run]] = {key: [] for key in labels}
        for r in range(s.rounds):
            order = list(labels)
            random.Random(s.seed * SEED_STRIDE_CELL + r * SEED_STRIDE_ROUND + index).shuffle(order)
            for key in order:
                if isinstance(key, ServiceConfig):
                    run, waves = self.services(key, w.prompts, w.batch_size), w.waves
                elif key in engine:   # waves of `batch` rows in one batch each
                    run = self.local.engine(engine[key].chain, engine[key].window, w.ids, w.batch_size)
                    waves = w.waves
                else:
                    run = self.local.peer(key, w.ids, w.batch_size)
                    waves = len(w.prompts) if w.batch_size == 1 else w.waves
                measured[key].append(run)
                self.progress.advance(waves, f"{w.kind} B={w.batch_size} round {r + 1}/{s.rounds}")
        runoff = self.runoff(w, plan, measured, runs) if self.runoff_waves(w) else None
        cell, mismatches = self._cell_result(w, plan, engine, measured, screened, runs)
        cell.runoff = runoff
        return cell, mismatches

    def runoff(self, w: Workload, plan: dict[str, ServiceConfig], measured: dict[object, list[Run]],
               runs: dict[str, list[list[list[int]]]]) -> Runoff:
        """Adaptive and the static configuration fastest over the rounds (`plan` has both: target-only at
        least), `runoff_rounds` rounds more, alternating which goes first; their outputs are checked against
        TMO's like every run's."""
        statics = [label for label in plan if label != ADAPTIVE]
        speed = {label: _spread(measured[plan[label]]).median for label in statics}
        best = max(statics, key=lambda label: speed[label])
        adaptive_config, best_config = plan[ADAPTIVE], plan[best]
        done: dict[ServiceConfig, list[Run]] = {adaptive_config: [], best_config: []}
        rounds = self.settings.runoff_rounds
        for r in range(rounds):
            pair = (adaptive_config, best_config) if r % 2 == 0 else (best_config, adaptive_config)
            for config in pair:
                done[config].append(self.services(config, w.prompts, w.batch_size))
                self.progress.advance(w.waves, f"{w.kind} B={w.batch_size} run-off {r + 1}/{rounds}")
        runs[f"run-off {ADAPTIVE}"] = [run.outputs for run in done[adaptive_config]]
        runs[f"run-off {best}"] = [run.outputs for run in done[best_config]]
        adaptive_rounds = _spread(measured[adaptive_config]).median
        return Runoff.of(best, _rates(done[adaptive_config]), _rates(done[best_config]),
                         adaptive_rounds / speed[best] if speed[best] else 0.0)

    def _cell_result(self, w: Workload, plan: dict[str, ServiceConfig], engine: dict[str, ServiceConfig],
                     measured: dict[object, list[Run]], screened: list[Screened],
                     runs: dict[str, list[list[list[int]]]]) -> tuple[Cell, list[Mismatch]]:
        reference = measured[plan[TMO]][0].outputs
        entries, first_label = [], {}
        for label, config in plan.items():
            done, same_as = measured[config], first_label.get(config)
            if same_as is None:       # a configuration two labels share was measured (and is checked) once
                first_label[config] = label
                runs[label] = [r.outputs for r in done]
            entries.append(Entry(label, SERVICES, None if config.chain is None else list(config.chain), config.window,
                                 _spread(done), breakdown=_breakdown(done), same_as=same_as))
        for label, config in engine.items():    # checked like the services: the same target decides
            done = measured[label]
            runs[label] = [r.outputs for r in done]
            entries.append(Entry(label, ENGINE, list(config.chain), config.window, _spread(done)))
        for label in self.peer_labels(w.batch_size):
            done = measured[label]
            entries.append(Entry(label, IN_PROCESS, None, 0, _spread(done),
                                 agrees_with_tmo=agreeing(reference, done[0].outputs)))
        mismatches = find_mismatches(w.kind, w.batch_size, reference, runs)
        return Cell(w.kind, w.batch_size, len(w.prompts), HF_TARGET, entries, screened), mismatches

    def run(self, cells: Sequence[Workload]) -> BenchReport:
        started = time.perf_counter()
        self.progress.start(sum(self.planned_waves(w) for w in cells))
        if cells:
            self.local.warm(cells[0].ids[0], self.drafters)
        results, mismatches = [], []
        for i, w in enumerate(cells):
            cell, found = self.cell(w, i)
            results.append(cell)
            mismatches.extend(found)
        set_ratios(results)
        checks = evaluate_checks(results, mismatches, self.drafters)
        return BenchReport(self.settings, self.models, results, mismatches, checks, time.perf_counter() - started,
                           machine_line())

    def close(self) -> None:
        self.client.close()


def _breakdown(runs: Sequence[Run]) -> Breakdown | None:
    totals = BreakdownSum()
    for run in runs:
        for stats, client_ns in run.stats:
            totals.observe(stats, client_ns)
    return totals.summary()


def _rates(runs: Sequence[Run]) -> list[float]:
    return [tokens_per_s(r.tokens, r.seconds) for r in runs]


def _spread(runs: Sequence[Run]) -> Spread:
    return Spread.of(_rates(runs))


def run_bench(pool_dir: Path, settings: BenchSettings, prompts: Sequence[Prompt], router: str | None = None,
              redis_url: str | None = None, progress: Progress = Progress(),
              say: Callable[[str], None] = lambda _line: None) -> BenchReport:
    """The whole bench: loads the pool's models here, starts a local cluster of the pool unless `router`
    is given, runs every cell, stops the cluster."""
    from specrouter.launcher import MEASURING_ROUTER_ARGS, LocalCluster

    check_kinds(prompts, settings.kinds)
    local = InProcessRows.load(pool_dir, settings.device, settings.dtype, settings.max_new_tokens)
    cells = workloads(prompts, settings, local.peers.encode)
    cluster = None
    try:
        if router is None:
            say("starting a local cluster of the pool ...")
            cluster = LocalCluster(pool_dir, Path(tempfile.mkdtemp(prefix="specrouter-bench-")), port=0,
                                   redis_url=redis_url, dtype=settings.dtype, device=settings.device,
                                   on_start=lambda s: say(f"{s.name} up at {s.address}"),
                                   models_in_router=settings.models_in_router,
                                   router_args=list(MEASURING_ROUTER_ARGS))
            router = cluster.router.address
        bench = Bench(router, local, settings, progress)
        try:
            return bench.run(cells)
        finally:
            bench.close()
    finally:
        if cluster is not None:
            cluster.stop()


class RichProgress(Progress):
    """A rich progress bar on stderr over the generate waves (stdout stays for the report). Where stderr
    is no terminal (a log file, CI) the bar cannot redraw, so each new phase prints one line instead."""

    def __init__(self, console=None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        self.console = console or Console(stderr=True)
        self.bar = Bar(TextColumn("{task.description:<32}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TimeRemainingColumn(), console=self.console, transient=False)
        self.task = None
        self._phase = ""

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def start(self, total: int) -> None:
        self.task = self.bar.add_task("bench", total=total)

    def advance(self, waves: int, description: str) -> None:
        self.bar.update(self.task, advance=waves, description=description)
        if not self.console.is_terminal and description != self._phase:
            self._phase = description
            task = self.bar.tasks[0]
            self.console.print(f"{description}: {task.completed:g}/{task.total:g} waves, {task.elapsed or 0:.0f} s",
                               highlight=False)

    def lower_total(self, waves: int) -> None:
        if waves:
            self.bar.update(self.task, total=self.bar.tasks[0].total - waves)
