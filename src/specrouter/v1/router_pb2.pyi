from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "max_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop", "chain", "window")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    chain: str
    window: int
    def __init__(self, prompt: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., chain: _Optional[str] = ..., window: _Optional[int] = ...) -> None: ...

class GenerationStats(_message.Message):
    __slots__ = ("cycles", "chain_counts", "accepted_per_level", "prompt_tokens", "generated_tokens", "queue_ns", "total_ns", "seed", "breakdown")
    class ChainCountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AcceptedPerLevelEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    CHAIN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_LEVEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_NS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    BREAKDOWN_FIELD_NUMBER: _ClassVar[int]
    cycles: int
    chain_counts: _containers.ScalarMap[str, int]
    accepted_per_level: _containers.ScalarMap[str, float]
    prompt_tokens: int
    generated_tokens: int
    queue_ns: int
    total_ns: int
    seed: int
    breakdown: CycleBreakdown
    def __init__(self, cycles: _Optional[int] = ..., chain_counts: _Optional[_Mapping[str, int]] = ..., accepted_per_level: _Optional[_Mapping[str, float]] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., queue_ns: _Optional[int] = ..., total_ns: _Optional[int] = ..., seed: _Optional[int] = ..., breakdown: _Optional[_Union[CycleBreakdown, _Mapping]] = ...) -> None: ...

class LevelTiming(_message.Message):
    __slots__ = ("calls", "call_ns", "handler_ns", "forward_ns")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CALL_NS_FIELD_NUMBER: _ClassVar[int]
    HANDLER_NS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    calls: int
    call_ns: int
    handler_ns: int
    forward_ns: int
    def __init__(self, calls: _Optional[int] = ..., call_ns: _Optional[int] = ..., handler_ns: _Optional[int] = ..., forward_ns: _Optional[int] = ...) -> None: ...

class CycleBreakdown(_message.Message):
    __slots__ = ("cycle_ns", "choose_ns", "prefill_ns", "levels", "ahead", "cycles_from_ahead", "late_prefill_ns")
    class LevelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: LevelTiming
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[LevelTiming, _Mapping]] = ...) -> None: ...
    CYCLE_NS_FIELD_NUMBER: _ClassVar[int]
    CHOOSE_NS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_NS_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FROM_AHEAD_FIELD_NUMBER: _ClassVar[int]
    LATE_PREFILL_NS_FIELD_NUMBER: _ClassVar[int]
    cycle_ns: int
    choose_ns: int
    prefill_ns: int
    levels: _containers.MessageMap[str, LevelTiming]
    ahead: LevelTiming
    cycles_from_ahead: int
    late_prefill_ns: int
    def __init__(self, cycle_ns: _Optional[int] = ..., choose_ns: _Optional[int] = ..., prefill_ns: _Optional[int] = ..., levels: _Optional[_Mapping[str, LevelTiming]] = ..., ahead: _Optional[_Union[LevelTiming, _Mapping]] = ..., cycles_from_ahead: _Optional[int] = ..., late_prefill_ns: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stats")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stats: GenerationStats
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stats")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stats: GenerationStats
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "parameters", "role", "address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    parameters: int
    role: str
    address: str
    def __init__(self, name: _Optional[str] = ..., parameters: _Optional[int] = ..., role: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "levels")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    levels: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., levels: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("greedy_rows", "sampling_rows")
    GREEDY_ROWS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_ROWS_FIELD_NUMBER: _ClassVar[int]
    greedy_rows: int
    sampling_rows: int
    def __init__(self, greedy_rows: _Optional[int] = ..., sampling_rows: _Optional[int] = ...) -> None: ...

class CandidatePrediction(_message.Message):
    __slots__ = ("chain", "window", "predicted_t_eff_ms", "predicted_cycle_ms", "predicted_emitted")
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_T_EFF_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CYCLE_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_EMITTED_FIELD_NUMBER: _ClassVar[int]
    chain: _containers.RepeatedScalarFieldContainer[str]
    window: int
    predicted_t_eff_ms: float
    predicted_cycle_ms: float
    predicted_emitted: float
    def __init__(self, chain: _Optional[_Iterable[str]] = ..., window: _Optional[int] = ..., predicted_t_eff_ms: _Optional[float] = ..., predicted_cycle_ms: _Optional[float] = ..., predicted_emitted: _Optional[float] = ...) -> None: ...

class PairLedger(_message.Message):
    __slots__ = ("drafter", "verifier", "mode", "accepted", "checked", "predicted_accepted", "predicted_checked")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CHECKED_FIELD_NUMBER: _ClassVar[int]
    drafter: str
    verifier: str
    mode: str
    accepted: float
    checked: float
    predicted_accepted: float
    predicted_checked: float
    def __init__(self, drafter: _Optional[str] = ..., verifier: _Optional[str] = ..., mode: _Optional[str] = ..., accepted: _Optional[float] = ..., checked: _Optional[float] = ..., predicted_accepted: _Optional[float] = ..., predicted_checked: _Optional[float] = ...) -> None: ...

class CycleLedger(_message.Message):
    __slots__ = ("chain", "window", "batch_size", "adaptive", "cycles", "cycle_ms", "emitted", "predicted_cycle_ms", "predicted_emitted", "pairs")
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    CYCLES_FIELD_NUMBER: _ClassVar[int]
    CYCLE_MS_FIELD_NUMBER: _ClassVar[int]
    EMITTED_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CYCLE_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_EMITTED_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    chain: _containers.RepeatedScalarFieldContainer[str]
    window: int
    batch_size: int
    adaptive: bool
    cycles: int
    cycle_ms: float
    emitted: float
    predicted_cycle_ms: float
    predicted_emitted: float
    pairs: _containers.RepeatedCompositeFieldContainer[PairLedger]
    def __init__(self, chain: _Optional[_Iterable[str]] = ..., window: _Optional[int] = ..., batch_size: _Optional[int] = ..., adaptive: _Optional[bool] = ..., cycles: _Optional[int] = ..., cycle_ms: _Optional[float] = ..., emitted: _Optional[float] = ..., predicted_cycle_ms: _Optional[float] = ..., predicted_emitted: _Optional[float] = ..., pairs: _Optional[_Iterable[_Union[PairLedger, _Mapping]]] = ...) -> None: ...

class PairEstimate(_message.Message):
    __slots__ = ("drafter", "verifier", "mode", "similarity", "prior", "realized", "rates", "live_similarity")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    PRIOR_FIELD_NUMBER: _ClassVar[int]
    REALIZED_FIELD_NUMBER: _ClassVar[int]
    RATES_FIELD_NUMBER: _ClassVar[int]
    LIVE_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    drafter: str
    verifier: str
    mode: str
    similarity: float
    prior: float
    realized: float
    rates: _containers.RepeatedScalarFieldContainer[float]
    live_similarity: float
    def __init__(self, drafter: _Optional[str] = ..., verifier: _Optional[str] = ..., mode: _Optional[str] = ..., similarity: _Optional[float] = ..., prior: _Optional[float] = ..., realized: _Optional[float] = ..., rates: _Optional[_Iterable[float]] = ..., live_similarity: _Optional[float] = ...) -> None: ...

class Calibration(_message.Message):
    __slots__ = ("mode", "intercept", "slope", "pairs")
    MODE_FIELD_NUMBER: _ClassVar[int]
    INTERCEPT_FIELD_NUMBER: _ClassVar[int]
    SLOPE_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    intercept: float
    slope: float
    pairs: int
    def __init__(self, mode: _Optional[str] = ..., intercept: _Optional[float] = ..., slope: _Optional[float] = ..., pairs: _Optional[int] = ...) -> None: ...

class ScheduleResponse(_message.Message):
    __slots__ = ("candidates", "ledgers", "pairs", "calibration", "decisions", "explorations", "switches", "decision_us", "cycle_ms", "plans", "planning_ms", "stand_ins")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    LEDGERS_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    EXPLORATIONS_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    DECISION_US_FIELD_NUMBER: _ClassVar[int]
    CYCLE_MS_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    PLANNING_MS_FIELD_NUMBER: _ClassVar[int]
    STAND_INS_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[CandidatePrediction]
    ledgers: _containers.RepeatedCompositeFieldContainer[CycleLedger]
    pairs: _containers.RepeatedCompositeFieldContainer[PairEstimate]
    calibration: _containers.RepeatedCompositeFieldContainer[Calibration]
    decisions: int
    explorations: int
    switches: int
    decision_us: float
    cycle_ms: float
    plans: int
    planning_ms: float
    stand_ins: int
    def __init__(self, candidates: _Optional[_Iterable[_Union[CandidatePrediction, _Mapping]]] = ..., ledgers: _Optional[_Iterable[_Union[CycleLedger, _Mapping]]] = ..., pairs: _Optional[_Iterable[_Union[PairEstimate, _Mapping]]] = ..., calibration: _Optional[_Iterable[_Union[Calibration, _Mapping]]] = ..., decisions: _Optional[int] = ..., explorations: _Optional[int] = ..., switches: _Optional[int] = ..., decision_us: _Optional[float] = ..., cycle_ms: _Optional[float] = ..., plans: _Optional[int] = ..., planning_ms: _Optional[float] = ..., stand_ins: _Optional[int] = ...) -> None: ...
