"""The bench's records and arithmetic: speeds over rounds, the per-cycle breakdown, output equality, checks.

Everything here works on plain numbers and token ids, so it is tested without a cluster or a model.

- `Spread`: the median tokens/s of a configuration over the rounds and its range (min, max).
- `BreakdownSum` / `Breakdown`: where a request's time went, summed over the requests of a configuration
  and turned into milliseconds per router cycle (`sum / cycles`), from `result.stats.breakdown`.
- `find_mismatches`: every greedy run of every services configuration and of the engine in process
  against target-only's tokens.
- `set_ratios`: each configuration over the cell's reference, and what the services keep of the engine
  in process on the same chain and window (`Entry.kept`).
- `Runoff`: at a batched cell, adaptive against the rounds' fastest static configuration, in rounds of
  their own after the rounds.
- `evaluate_checks`: the bench's PASS / FAIL / not run lines, from the same run's cells.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from specrouter.report.scheduler_stats import log_ratio_se

# configuration labels
TMO = "TMO"                       # target-only through the services
SSD_SMALLEST = "SSD-smallest"     # the smallest drafter and the target, at its best screened window
SSD_TUNED = "SSD-tuned"           # the best static two-level chain and window of the screening
THREE_LEVEL = "three-level"       # every model, smallest first, at the --three-level-window
LOOKUP_CHAIN = "lookup"           # the router's lookup level (no model) and the target, at the --lookup-window
LOOKUP_THREE_LEVEL = "lookup-three-level"   # the lookup level, the smallest drafter and the target, same window
ADAPTIVE = "adaptive"             # chain "auto", window 0
HF_TARGET = "hf-generate"         # transformers target-only generate (batched at B > 1)
HF_ASSISTED = "hf-assisted"       # transformers assisted generation; the drafter follows the colon
HF_PROMPT_LOOKUP = "hf-prompt-lookup"   # transformers prompt lookup (`prompt_lookup_num_tokens`), batch 1
# paths: through the services; transformers in process; SpecRouter's own engine in process (the router's
# chain step over the worker engines), whose labels are `engine:` and the services twin's label
SERVICES, IN_PROCESS, ENGINE = "services", "in-process", "engine"
# services configurations whose chain and window also run on the engine in process, each beside its twin
ENGINE_TWINS = (TMO, SSD_TUNED, THREE_LEVEL)
KEEP_CHECKED = (SSD_TUNED, THREE_LEVEL)   # the multi-level ones, whose kept share is checked at batch 1

PASS, FAIL, NOT_RUN = "PASS", "FAIL", "not run"
NS_PER_MS = 1e6

# thresholds of the checks (ratios of median tokens/s)
TMO_OVER_HF_MIN = 0.92
ADAPTIVE_CODE_OVER_HF_MIN = 1.35
ADAPTIVE_CODE_OVER_ASSISTED_MIN = 1.15
ADAPTIVE_REPETITIVE_OVER_HF_MIN = 1.8
ADAPTIVE_OVER_BATCHED_MIN = 1.15
SERVICES_KEEP_MIN = 0.9           # services over the engine in process, same chain and window
BATCHED_CHECK_SIZES = (4, 16)
ADAPTIVE_OVER_BEST_STATIC_MIN = 0.97   # adaptive over the best static configuration, in the run-off (batch > 1)
CODE, REPETITIVE = "code", "repetitive"


def assisted_label(drafter: str) -> str:
    return f"{HF_ASSISTED}:{drafter}"


def engine_label(services_label: str) -> str:
    """The label of the engine-in-process twin of a services configuration."""
    return f"{ENGINE}:{services_label}"


@dataclass(frozen=True)
class Spread:
    """Tokens/s of one configuration over the rounds: the median and the range."""

    median: float
    low: float
    high: float
    runs: list[float]

    @classmethod
    def of(cls, runs: Sequence[float]) -> Spread:
        if not runs:
            raise ValueError("a spread needs at least one run")
        return cls(statistics.median(runs), min(runs), max(runs), list(runs))

    @property
    def relative_range(self) -> float:
        """(max - min) / median: how far apart the rounds measured."""
        return (self.high - self.low) / self.median if self.median else 0.0


def tokens_per_s(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


# -- the per-cycle breakdown ----------------------------------------------------------------------

@dataclass
class LevelSum:
    calls: int = 0
    call_ns: int = 0
    handler_ns: int = 0
    forward_ns: int = 0


@dataclass
class BreakdownSum:
    """Sums over a configuration's requests of their stats and breakdowns (nanoseconds).

    `available` turns False for good at the first result without `stats.breakdown` (a router that does
    not report it): the breakdown is then shown as unavailable rather than made of partial sums."""

    requests: int = 0
    cycles: int = 0
    total_ns: int = 0
    queue_ns: int = 0
    client_ns: int = 0
    cycle_ns: int = 0
    choose_ns: int = 0
    prefill_ns: int = 0
    late_prefill_ns: int = 0
    levels: dict[str, LevelSum] = field(default_factory=dict)
    available: bool = True

    def observe(self, stats, client_ns: int) -> None:
        """Adds one request: its `GenerationStats` and the client's wall time of the call."""
        breakdown = getattr(stats, "breakdown", None)
        if breakdown is None:
            self.available = False
            return
        self.requests += 1
        self.cycles += stats.cycles
        self.total_ns += stats.total_ns
        self.queue_ns += stats.queue_ns
        self.client_ns += client_ns
        self.cycle_ns += breakdown.cycle_ns
        self.choose_ns += breakdown.choose_ns
        self.prefill_ns += breakdown.prefill_ns
        self.late_prefill_ns += breakdown.late_prefill_ns
        for model, timing in breakdown.levels.items():
            level = self.levels.setdefault(model, LevelSum())
            level.calls += timing.calls
            level.call_ns += timing.call_ns
            level.handler_ns += timing.handler_ns
            level.forward_ns += timing.forward_ns

    def summary(self) -> Breakdown | None:
        """Milliseconds per cycle (per request for the client's share); None when unavailable or empty."""
        if not self.available or not self.requests or not self.cycles:
            return None
        per_cycle = lambda ns: ns / self.cycles / NS_PER_MS   # noqa: E731
        calls = sum(level.call_ns for level in self.levels.values())
        handlers = sum(level.handler_ns for level in self.levels.values())
        forwards = sum(level.forward_ns for level in self.levels.values())
        outside = self.total_ns - self.queue_ns - self.cycle_ns   # the queue ends after the prefill
        return Breakdown(
            requests=self.requests, cycles=self.cycles,
            forward_ms={m: per_cycle(level.forward_ns) for m, level in sorted(self.levels.items())},
            handler_outside_forward_ms=per_cycle(handlers - forwards),
            transport_ms=per_cycle(calls - handlers),
            router_in_cycle_ms=per_cycle(self.cycle_ns - calls - self.choose_ns - self.late_prefill_ns),
            choose_ms=per_cycle(self.choose_ns),
            late_prefill_ms=per_cycle(self.late_prefill_ns),
            outside_cycles_ms=per_cycle(outside),
            cycle_ms=per_cycle(self.cycle_ns),
            client_side_ms_per_request=(self.client_ns - self.total_ns) / self.requests / NS_PER_MS)


@dataclass(frozen=True)
class Breakdown:
    """Where a configuration's time went, in ms per router cycle of a request (averaged over requests)."""

    requests: int
    cycles: int
    forward_ms: dict[str, float]        # each model's forward passes
    handler_outside_forward_ms: float   # the workers' handlers around the forward passes (decode, engine, encode)
    transport_ms: float                 # the router's calls less the handlers: gRPC, serialization, transport
    router_in_cycle_ms: float           # the router's cycle less its calls, its choice and its late prefills
    choose_ms: float                    # the router's chain and window decision
    late_prefill_ms: float              # prefills of rows on a model of the chain that had not seen them yet
    outside_cycles_ms: float            # total - queue - cycles (the queue holds the prefill): the batcher's loop
    cycle_ms: float                     # the router's cycle, all of it
    client_side_ms_per_request: float   # the client's wall time of a call less the router's total, per request


# -- one configuration at one cell ----------------------------------------------------------------

@dataclass
class Entry:
    """One configuration measured at one (kind, batch) cell."""

    label: str
    path: str                          # SERVICES, IN_PROCESS (transformers) or ENGINE
    chain: list[str] | None            # None: adaptive, or a transformers peer
    window: int
    tokens_per_s: Spread
    ratio: float | None = None         # over the cell's reference (in-process target-only at this batch)
    ratio_to_batch1: float | None = None   # over in-process target-only at batch 1 (the kind's batch-1 cell)
    agrees_with_tmo: int | None = None     # prompts whose tokens equal TMO's (transformers peers only)
    breakdown: Breakdown | None = None
    same_as: str | None = None         # measured once with this other label (same chain and window)
    kept: float | None = None          # services with an engine twin: this median over the twin's


@dataclass(frozen=True)
class Screened:
    chain: list[str]
    window: int
    tokens_per_s: float


@dataclass(frozen=True)
class Runoff:
    """Adaptive against the static configuration fastest over the rounds (`best`), in rounds of their own
    after them, the two alternating: the rounds' fastest of several is picked by its luck as well as its
    speed, so its own rounds would flatter it; measured again beside adaptive, it is not."""

    best: str                          # label of the services configuration fastest over the rounds
    adaptive: Spread
    static: Spread
    ratio: float                       # adaptive's median over the best static's, in the run-off
    se: float | None                   # standard error of the mean log ratio of paired rounds (None: one round)
    rounds_ratio: float                # the same ratio over the rounds' medians, before the run-off

    @classmethod
    def of(cls, best: str, adaptive: Sequence[float], static: Sequence[float], rounds_ratio: float) -> Runoff:
        """From the run-off's tokens/s, round by round (adaptive's and the best static's of a round paired)."""
        a, b = Spread.of(adaptive), Spread.of(static)
        return cls(best, a, b, a.median / b.median if b.median else 0.0, log_ratio_se(adaptive, static), rounds_ratio)


@dataclass
class Cell:
    kind: str
    batch_size: int
    requests: int
    reference: str                     # label of the ratio's reference
    entries: list[Entry]
    screening: list[Screened]
    runoff: Runoff | None = None       # batch sizes above 1: adaptive against the best static, again

    def entry(self, label: str) -> Entry | None:
        return next((e for e in self.entries if e.label == label), None)


@dataclass(frozen=True)
class Mismatch:
    """A services or engine run whose greedy tokens differ from TMO's for one prompt."""

    kind: str
    batch_size: int
    label: str
    prompt_index: int
    position: int          # first differing token (the shorter's length if one is a prefix of the other)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token lists differ; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def find_mismatches(kind: str, batch: int, reference: Sequence[Sequence[int]],
                    runs: Mapping[str, Iterable[Sequence[Sequence[int]]]]) -> list[Mismatch]:
    """Every run (per label, a list of per-prompt token ids) against `reference`, prompt by prompt."""
    found = []
    for label, label_runs in runs.items():
        for run in label_runs:
            for i, (want, got) in enumerate(zip(reference, run)):
                position = first_difference(want, got)
                if position is not None:
                    found.append(Mismatch(kind, batch, label, i, position))
    return found


def agreeing(reference: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]) -> int:
    """Prompts whose tokens are equal in both."""
    return sum(first_difference(a, b) is None for a, b in zip(reference, outputs))


# -- ratios and checks ----------------------------------------------------------------------------

def set_ratios(cells: Sequence[Cell]) -> None:
    """Fills every entry's ratio to its cell's reference and to the kind's batch-1 in-process target-only,
    and each services entry's share kept of its engine twin (the same chain and window in process)."""
    batch1 = {c.kind: c.entry(HF_TARGET) for c in cells if c.batch_size == 1}
    for cell in cells:
        reference, single = cell.entry(cell.reference), batch1.get(cell.kind)
        for e in cell.entries:
            e.ratio = _ratio(e, reference)
            e.ratio_to_batch1 = _ratio(e, single)
            if e.path == SERVICES and e.label in ENGINE_TWINS:
                e.kept = _ratio(e, cell.entry(engine_label(e.label)))


def _ratio(entry: Entry, reference: Entry | None) -> float | None:
    if reference is None or not reference.tokens_per_s.median:
        return None
    return entry.tokens_per_s.median / reference.tokens_per_s.median


@dataclass(frozen=True)
class Check:
    name: str
    status: str                  # PASS, FAIL or NOT_RUN
    value: float | None          # the measured ratio (None for the equality check and where not run)
    threshold: float | None
    detail: str


def _ratio_check(name: str, cells: Sequence[Cell], kind: str, batch: int, label: str, over: str | Sequence[str],
                 threshold: float) -> Check:
    """`label`'s median over the fastest of `over`'s at the (kind, batch) cell, at least `threshold`."""
    cell = next((c for c in cells if c.kind == kind and c.batch_size == batch), None)
    entry = cell.entry(label) if cell else None
    refs = [r for r in (cell.entry(o) for o in ([over] if isinstance(over, str) else over)) if r] if cell else []
    if entry is None or not refs:
        return Check(name, NOT_RUN, None, threshold, f"no {kind} cell at batch {batch} with {label}")
    ref = max(refs, key=lambda r: r.tokens_per_s.median)
    value = entry.tokens_per_s.median / ref.tokens_per_s.median if ref.tokens_per_s.median else 0.0
    detail = (f"{label} {entry.tokens_per_s.median:.1f} tok/s over {ref.label} {ref.tokens_per_s.median:.1f}"
              f" = {value:.3f}x (needs >= {threshold}x)")
    return Check(name, PASS if value >= threshold else FAIL, value, threshold, detail)


def evaluate_checks(cells: Sequence[Cell], mismatches: Sequence[Mismatch], drafters: Sequence[str]) -> list[Check]:
    """The bench's checks, each from the run's own cells; a check whose cell was not run is NOT_RUN."""
    kinds = list(dict.fromkeys([CODE, *(c.kind for c in cells if c.batch_size == 1)]))
    checks = [_ratio_check(f"services TMO >= {TMO_OVER_HF_MIN}x in-process target-only, {kind}, batch 1",
                           cells, kind, 1, TMO, HF_TARGET, TMO_OVER_HF_MIN) for kind in kinds]
    checks.append(_ratio_check(f"adaptive >= {ADAPTIVE_CODE_OVER_HF_MIN}x in-process target-only, code, batch 1",
                               cells, CODE, 1, ADAPTIVE, HF_TARGET, ADAPTIVE_CODE_OVER_HF_MIN))
    checks.append(_ratio_check(f"adaptive >= {ADAPTIVE_CODE_OVER_ASSISTED_MIN}x the best transformers assisted "
                               "generation, code, batch 1", cells, CODE, 1, ADAPTIVE,
                               [assisted_label(d) for d in drafters], ADAPTIVE_CODE_OVER_ASSISTED_MIN))
    checks.append(_ratio_check(f"adaptive >= {ADAPTIVE_REPETITIVE_OVER_HF_MIN}x in-process target-only, repetitive, "
                               "batch 1", cells, REPETITIVE, 1, ADAPTIVE, HF_TARGET, ADAPTIVE_REPETITIVE_OVER_HF_MIN))
    for batch in BATCHED_CHECK_SIZES:
        checks.append(_ratio_check(f"adaptive >= {ADAPTIVE_OVER_BATCHED_MIN}x in-process batched target-only "
                                   f"generate, code, batch {batch}", cells, CODE, batch, ADAPTIVE, HF_TARGET,
                                   ADAPTIVE_OVER_BATCHED_MIN))
    checks += [keep_check(cells, kind) for kind in kinds]
    for batch in BATCHED_CHECK_SIZES:
        batched = [c.kind for c in cells if c.batch_size == batch] or [CODE]
        checks += [runoff_check(cells, kind, batch) for kind in dict.fromkeys(batched)]
    checks.append(equality_check(cells, mismatches))
    return checks


def runoff_check(cells: Sequence[Cell], kind: str, batch: int) -> Check:
    """Adaptive over the best static configuration at a batched cell, in the cell's run-off, at least
    ADAPTIVE_OVER_BEST_STATIC_MIN."""
    name = f"adaptive >= {ADAPTIVE_OVER_BEST_STATIC_MIN}x the best static configuration (run-off), {kind}, batch {batch}"
    cell = next((c for c in cells if c.kind == kind and c.batch_size == batch), None)
    r = cell.runoff if cell else None
    if r is None:
        return Check(name, NOT_RUN, None, ADAPTIVE_OVER_BEST_STATIC_MIN, f"no {kind} cell at batch {batch} with a run-off")
    se = f" (standard error {r.se:.3f})" if r.se is not None else ""
    detail = (f"adaptive {r.adaptive.median:.1f} tok/s over {r.best} {r.static.median:.1f} in {len(r.adaptive.runs)} "
              f"run-off rounds = {r.ratio:.3f}x{se}; over the rounds' medians {r.rounds_ratio:.3f}x "
              f"(needs >= {ADAPTIVE_OVER_BEST_STATIC_MIN}x)")
    return Check(name, PASS if r.ratio >= ADAPTIVE_OVER_BEST_STATIC_MIN else FAIL, r.ratio,
                 ADAPTIVE_OVER_BEST_STATIC_MIN, detail)


def keep_check(cells: Sequence[Cell], kind: str) -> Check:
    """What the services keep of the engine in process at the kind's batch-1 cell: the lowest share over
    the multi-level chains run both ways (the services' lock-step chain against the same chain and window
    in process), at least SERVICES_KEEP_MIN."""
    name = f"services keep >= {SERVICES_KEEP_MIN}x the same chain and window in process, {kind}, batch 1"
    found = [_ratio_check(name, cells, kind, 1, label, engine_label(label), SERVICES_KEEP_MIN)
             for label in KEEP_CHECKED]
    ran = [c for c in found if c.status != NOT_RUN]
    if not ran:
        return Check(name, NOT_RUN, None, SERVICES_KEEP_MIN,
                     f"no {kind} cell at batch 1 with a multi-level chain through the services and in process")
    return min(ran, key=lambda c: c.value)


def equality_check(cells: Sequence[Cell], mismatches: Sequence[Mismatch]) -> Check:
    name = "greedy outputs equal across every services configuration and the engine in process"
    if not cells:
        return Check(name, NOT_RUN, None, None, "no cells were run")
    if not mismatches:
        return Check(name, PASS, None, None,
                     f"every services and engine run equals TMO's tokens in {len(cells)} cells")
    first = mismatches[0]
    return Check(name, FAIL, None, None,
                 f"{len(mismatches)} runs differ from TMO; first: {first.label} on {first.kind} batch "
                 f"{first.batch_size}, prompt {first.prompt_index}, token {first.position}")
