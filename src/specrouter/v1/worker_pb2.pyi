from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_name", "parameters", "vocab_size", "tokenizer_sha256", "context_length", "device", "dtype", "live_states", "warmup_forwards")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_SHA256_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LIVE_STATES_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FORWARDS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    parameters: int
    vocab_size: int
    tokenizer_sha256: str
    context_length: int
    device: str
    dtype: str
    live_states: int
    warmup_forwards: _containers.RepeatedCompositeFieldContainer[ForwardTiming]
    def __init__(self, model_name: _Optional[str] = ..., parameters: _Optional[int] = ..., vocab_size: _Optional[int] = ..., tokenizer_sha256: _Optional[str] = ..., context_length: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., live_states: _Optional[int] = ..., warmup_forwards: _Optional[_Iterable[_Union[ForwardTiming, _Mapping]]] = ...) -> None: ...

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "coupled")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    COUPLED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    seed: int
    coupled: bool
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., coupled: _Optional[bool] = ...) -> None: ...

class RowStep(_message.Message):
    __slots__ = ("row_id", "rollback", "pending_tokens", "sampling", "cycle")
    ROW_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    PENDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CYCLE_FIELD_NUMBER: _ClassVar[int]
    row_id: str
    rollback: int
    pending_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: Sampling
    cycle: int
    def __init__(self, row_id: _Optional[str] = ..., rollback: _Optional[int] = ..., pending_tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., cycle: _Optional[int] = ...) -> None: ...

class DistributionRow(_message.Message):
    __slots__ = ("values_fp16", "indices_int32")
    VALUES_FP16_FIELD_NUMBER: _ClassVar[int]
    INDICES_INT32_FIELD_NUMBER: _ClassVar[int]
    values_fp16: bytes
    indices_int32: bytes
    def __init__(self, values_fp16: _Optional[bytes] = ..., indices_int32: _Optional[bytes] = ...) -> None: ...

class Proposal(_message.Message):
    __slots__ = ("row_id", "tokens", "rows", "accepted", "similarity")
    ROW_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    row_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    rows: _containers.RepeatedCompositeFieldContainer[DistributionRow]
    accepted: int
    similarity: float
    def __init__(self, row_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., rows: _Optional[_Iterable[_Union[DistributionRow, _Mapping]]] = ..., accepted: _Optional[int] = ..., similarity: _Optional[float] = ...) -> None: ...

class PrefillRow(_message.Message):
    __slots__ = ("row_id", "tokens")
    ROW_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    row_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, row_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("state_id", "rows", "predictions")
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    state_id: str
    rows: _containers.RepeatedCompositeFieldContainer[PrefillRow]
    predictions: int
    def __init__(self, state_id: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[PrefillRow, _Mapping]]] = ..., predictions: _Optional[int] = ...) -> None: ...

class PrefillPredictions(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("timing", "predictions")
    TIMING_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    timing: Timing
    predictions: _containers.RepeatedCompositeFieldContainer[PrefillPredictions]
    def __init__(self, timing: _Optional[_Union[Timing, _Mapping]] = ..., predictions: _Optional[_Iterable[_Union[PrefillPredictions, _Mapping]]] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("state_id", "level", "window", "rows", "hand_up")
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    HAND_UP_FIELD_NUMBER: _ClassVar[int]
    state_id: str
    level: int
    window: int
    rows: _containers.RepeatedCompositeFieldContainer[RowStep]
    hand_up: bool
    def __init__(self, state_id: _Optional[str] = ..., level: _Optional[int] = ..., window: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[RowStep, _Mapping]]] = ..., hand_up: _Optional[bool] = ...) -> None: ...

class VerifyRow(_message.Message):
    __slots__ = ("step", "proposal")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_FIELD_NUMBER: _ClassVar[int]
    step: RowStep
    proposal: Proposal
    def __init__(self, step: _Optional[_Union[RowStep, _Mapping]] = ..., proposal: _Optional[_Union[Proposal, _Mapping]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("state_id", "level", "hand_up", "rows")
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    HAND_UP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    state_id: str
    level: int
    hand_up: bool
    rows: _containers.RepeatedCompositeFieldContainer[VerifyRow]
    def __init__(self, state_id: _Optional[str] = ..., level: _Optional[int] = ..., hand_up: _Optional[bool] = ..., rows: _Optional[_Iterable[_Union[VerifyRow, _Mapping]]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("proposals", "timing")
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    proposals: _containers.RepeatedCompositeFieldContainer[Proposal]
    timing: Timing
    def __init__(self, proposals: _Optional[_Iterable[_Union[Proposal, _Mapping]]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("state_id", "row_ids")
    STATE_ID_FIELD_NUMBER: _ClassVar[int]
    ROW_IDS_FIELD_NUMBER: _ClassVar[int]
    state_id: str
    row_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, state_id: _Optional[str] = ..., row_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ForwardTiming(_message.Message):
    __slots__ = ("forward_ns", "batch_size", "tokens_per_row", "tokens_valid")
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_ROW_FIELD_NUMBER: _ClassVar[int]
    TOKENS_VALID_FIELD_NUMBER: _ClassVar[int]
    forward_ns: int
    batch_size: int
    tokens_per_row: int
    tokens_valid: int
    def __init__(self, forward_ns: _Optional[int] = ..., batch_size: _Optional[int] = ..., tokens_per_row: _Optional[int] = ..., tokens_valid: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("forwards", "handler_ns")
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    HANDLER_NS_FIELD_NUMBER: _ClassVar[int]
    forwards: _containers.RepeatedCompositeFieldContainer[ForwardTiming]
    handler_ns: int
    def __init__(self, forwards: _Optional[_Iterable[_Union[ForwardTiming, _Mapping]]] = ..., handler_ns: _Optional[int] = ...) -> None: ...
