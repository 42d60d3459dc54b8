"""The scheduler report's records: the configurations it runs, what one workload measured, the whole report.

A record's fields are its keys in `report.json`, in that order. `to_json` writes a record as plain JSON
types and `from_json` reads it back, so a saved report can be printed again as text.

- `Config`: one configuration of the router, a static (chain, window) or the adaptive scheduler.
- `RunResult`: one workload at one batch size: every static, adaptive, and the `Runoff` where one ran.
- `Report`: the runs, acceptance over all of them, the router's decision costs, the checks.
- `RunOutcome` / `Standing`: the figures of a run that the checks judge.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

ADAPTIVE = "auto"            # the chain a request names to let the scheduler choose
SWITCHING_PREFIX = "switching:"
OMIT_IF_NONE = {"omit_if_none": True}   # field metadata: left out of the JSON when None


@dataclass(frozen=True)
class Config:
    chain: tuple[str, ...] | None   # None: adaptive
    window: int

    @property
    def spec(self) -> str:
        """The chain as a request names it."""
        return ADAPTIVE if self.chain is None else ",".join(self.chain)

    @property
    def run_window(self) -> int:
        """The window the router runs and files the cycles under: none (0) for the target alone."""
        return self.window if self.chain is not None and len(self.chain) > 1 else 0

    def label(self) -> str:
        if self.chain is None:
            return "adaptive"
        return ",".join(self.chain) + (f" W{self.window}" if len(self.chain) > 1 else "")


def switching_kind(first: str, then: str) -> str:
    """The kind of a run of `first` requests followed by `then` requests, as one stream."""
    return f"{SWITCHING_PREFIX}{first}>{then}"


def is_switching(kind: str) -> bool:
    return kind.startswith(SWITCHING_PREFIX)


# -- one workload at one batch size ---------------------------------------------------------------

@dataclass(frozen=True)
class BestStatic:
    chain: tuple[str, ...]
    window: int
    tokens_per_s: float


@dataclass(frozen=True)
class Choice:
    """Adaptive's cycles at one (chain, window) it chose: the scheduler's prediction beside the measure,
    per cycle."""

    cycles: int
    predicted_cycle_ms: float
    measured_cycle_ms: float
    predicted_emitted: float
    measured_emitted: float


@dataclass(frozen=True)
class RowCycles:
    """A configuration's cycles at one (chain and window run, rows in the cycle): how many, the mean cycle,
    and the tokens a row emitted in one."""

    config: str
    rows: int
    cycles: int
    cycle_ms: float
    emitted: float
    ms_per_token: float | None


@dataclass(frozen=True)
class Wave:
    """Adaptive in one wave of a pass (`wave`: its index in the pass) beside the statics in the same wave."""

    wave: int
    tokens_per_s: float
    statics_tokens_per_s: list[float]
    choices: dict[str, Choice]


@dataclass(frozen=True)
class StaticResult:
    """A static configuration in the screening. Its measured T_eff is over the cycles that ran at the run's
    batch size, as its prediction is; `measured_t_eff_all_cycles_ms` counts every cycle."""

    chain: tuple[str, ...]
    window: int
    tokens_per_s: float                 # the median pass
    tokens_per_s_runs: list[float]
    predicted_t_eff_ms: float | None
    measured_t_eff_ms: float | None
    cycles: int
    measured_t_eff_all_cycles_ms: float | None
    cycles_at_batch_size: int
    predicted_cycle_ms: float | None
    predicted_emitted: float | None
    measured_cycle_ms: float | None
    measured_emitted: float | None


@dataclass(frozen=True)
class AdaptiveResult:
    predicted_t_eff_ms: float | None
    measured_t_eff_ms: float | None
    cycles: int
    measured_cycle_ms: float | None
    measured_emitted: float | None
    chain_counts: dict[str, int]        # most used first
    cycles_per_config: dict[str, int]   # most used first
    per_config: dict[str, Choice]


@dataclass(frozen=True)
class RunoffStatic:
    chain: tuple[str, ...]
    window: int
    tokens_per_s: float                 # over the run-off's waves
    tokens_per_s_runs: list[float]
    screening_tokens_per_s: float
    measured_t_eff_ms: float | None
    outside_cycles_ms_per_token: float | None
    cycles_by_rows: list[RowCycles]


@dataclass(frozen=True)
class Runoff:
    """Adaptive, target-only and the screening's fastest statics measured afresh; the checks judge these."""

    passes: int
    adaptive_tokens_per_s: float
    adaptive_tokens_per_s_runs: list[float]
    adaptive_measured_t_eff_ms: float | None
    adaptive_outside_cycles_ms_per_token: float | None
    adaptive_per_config: dict[str, Choice]
    adaptive_cycles_by_rows: list[RowCycles]
    adaptive_waves: list[Wave]
    # CPU the router spent planning per second of each configuration's runs: the planner shares the
    # machine with the workers, so what it spends slows adaptive's cycles
    planning_ms_per_s: dict[str, float]
    static: list[RunoffStatic]          # target-only first
    best_static: BestStatic
    adaptive_over_best_static: float
    # how far that ratio is to be trusted: the standard error of its log, from the waves' ratios
    adaptive_over_best_static_se: float | None
    adaptive_over_target_only: float
    adaptive_beats_every_static: bool


@dataclass(frozen=True)
class Acceptance:
    """A pair's acceptance over adaptive's cycles: the scheduler's prediction beside the realized rate."""

    pair: tuple[str, str]               # (drafter, verifier)
    mode: str
    realized: float
    predicted: float | None
    accepted: float
    checked: float
    predicted_accepted: float
    predicted_checked: float
    in_use: bool                        # checked often enough to be judged


@dataclass(frozen=True)
class Standing:
    """Adaptive against the others over one set of measurements."""

    adaptive_over_best_static: float
    adaptive_over_target_only: float
    adaptive_beats_every_static: bool

    @classmethod
    def of(cls, run: RunResult | Runoff) -> Standing:
        return cls(run.adaptive_over_best_static, run.adaptive_over_target_only, run.adaptive_beats_every_static)


@dataclass(frozen=True)
class RunOutcome:
    """What the checks judge of a run: its kind and its standings in the screening and the run-off."""

    kind: str
    screening: Standing
    runoff: Standing | None = None

    @property
    def decided(self) -> Standing:
        """The run-off's standing where there is one: it measures the screening's picks afresh."""
        return self.runoff or self.screening


@dataclass(frozen=True)
class RunResult:
    kind: str
    batch_size: int
    requests: int
    target_only_tokens_per_s: float
    adaptive_tokens_per_s: float
    adaptive_tokens_per_s_runs: list[float]
    best_static: BestStatic
    adaptive_over_best_static: float
    adaptive_over_target_only: float
    adaptive_beats_every_static: bool
    # the best static as one picks it from data: per wave, the best of the other waves (no winner's curse)
    held_out_best_static_tokens_per_s: float | None
    adaptive_over_held_out_best_static: float | None
    # a diagnostic of the screening's pick, not a check: a unit is one wave, and few at large batch sizes
    adaptive_over_held_out_best_static_se: float | None
    adaptive: AdaptiveResult
    rank_correlation: float | None      # of predicted and measured T_eff over the statics
    static: list[StaticResult]          # target-only first
    speculative_static: int
    acceptance: list[Acceptance]
    runoff: Runoff | None = field(default=None, metadata=OMIT_IF_NONE)

    def outcome(self) -> RunOutcome:
        return RunOutcome(self.kind, Standing.of(self), Standing.of(self.runoff) if self.runoff else None)


# -- the whole report -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RankCorrelation:
    mean: float | None
    min: float | None


@dataclass(frozen=True)
class Decision:
    """The router's decision and planning costs over the whole report."""

    decision_us: float
    cycle_ms: float
    share_of_cycle: float | None
    decisions: int
    explorations: int
    switches: int
    plans: int                          # the planner's rankings, spread over every cycle the router ran
    planning_ms: float
    stand_ins: int | None               # rankings asked for a shift not planned yet (the nearest one served)
    planning_ms_per_cycle: float | None
    planning_share_of_time: float | None


@dataclass(frozen=True)
class Calibration:
    mode: str
    intercept: float
    slope: float
    pairs: int


@dataclass(frozen=True)
class SettingsRecord:
    """The settings the report ran with, and the pool it measured."""

    batch_sizes: list[int]
    windows: list[int]
    max_new_tokens: int
    repeats: int
    temperature: float
    runoff_passes: int
    runoff_waves: int
    runoff_top: int
    switching_runoff_passes: int
    models: list[str]
    target: str


@dataclass(frozen=True)
class Report:
    runs: list[RunResult]
    acceptance: list[Acceptance]
    rank_correlation: RankCorrelation
    decision: Decision
    calibration: list[Calibration]
    settings: SettingsRecord
    checks: dict[str, bool | None]      # None: nothing to judge (not run)
    machine: str = ""                   # report.machine.machine_line() of the machine that ran the report

    @classmethod
    def from_json(cls, data: dict) -> Report:
        return from_json(cls, data)


def to_json(value: Any) -> Any:
    """`value` as plain JSON types: records as objects in field order (a field marked `OMIT_IF_NONE` left out
    when None), tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is not None or not f.metadata.get("omit_if_none"):
                out[f.name] = to_json(item)
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(x) for x in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(kind: Any, data: Any) -> Any:
    """`data`, as `to_json` wrote it, read back as `kind`: a record, or a list, tuple (of one type), dict or
    optional of records and plain values."""
    if data is None:
        return None
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, data)
    if origin in (list, tuple):
        return origin(from_json(args[0], x) for x in data)
    if origin is dict:
        return {k: from_json(args[1], v) for k, v in data.items()}
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(**{f.name: from_json(hints[f.name], data[f.name])
                       for f in dataclasses.fields(kind) if f.name in data})
    return data
