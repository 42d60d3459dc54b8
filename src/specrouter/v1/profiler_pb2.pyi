from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecodingMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECODING_MODE_UNSPECIFIED: _ClassVar[DecodingMode]
    DECODING_MODE_GREEDY: _ClassVar[DecodingMode]
    DECODING_MODE_SAMPLING: _ClassVar[DecodingMode]
    DECODING_MODE_COUPLED: _ClassVar[DecodingMode]
DECODING_MODE_UNSPECIFIED: DecodingMode
DECODING_MODE_GREEDY: DecodingMode
DECODING_MODE_SAMPLING: DecodingMode
DECODING_MODE_COUPLED: DecodingMode

class ForwardMeasurement(_message.Message):
    __slots__ = ("model", "batch_size", "tokens_per_row", "forward_ns")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_ROW_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    model: str
    batch_size: int
    tokens_per_row: int
    forward_ns: int
    def __init__(self, model: _Optional[str] = ..., batch_size: _Optional[int] = ..., tokens_per_row: _Optional[int] = ..., forward_ns: _Optional[int] = ...) -> None: ...

class AcceptanceMeasurement(_message.Message):
    __slots__ = ("drafter", "verifier", "mode", "position", "accepted", "proposed")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_FIELD_NUMBER: _ClassVar[int]
    drafter: str
    verifier: str
    mode: DecodingMode
    position: int
    accepted: int
    proposed: int
    def __init__(self, drafter: _Optional[str] = ..., verifier: _Optional[str] = ..., mode: _Optional[_Union[DecodingMode, str]] = ..., position: _Optional[int] = ..., accepted: _Optional[int] = ..., proposed: _Optional[int] = ...) -> None: ...

class SimilarityMeasurement(_message.Message):
    __slots__ = ("drafter", "verifier", "similarity", "mode", "positions")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    drafter: str
    verifier: str
    similarity: float
    mode: DecodingMode
    positions: int
    def __init__(self, drafter: _Optional[str] = ..., verifier: _Optional[str] = ..., similarity: _Optional[float] = ..., mode: _Optional[_Union[DecodingMode, str]] = ..., positions: _Optional[int] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("forward", "acceptance", "similarity")
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    forward: _containers.RepeatedCompositeFieldContainer[ForwardMeasurement]
    acceptance: _containers.RepeatedCompositeFieldContainer[AcceptanceMeasurement]
    similarity: _containers.RepeatedCompositeFieldContainer[SimilarityMeasurement]
    def __init__(self, forward: _Optional[_Iterable[_Union[ForwardMeasurement, _Mapping]]] = ..., acceptance: _Optional[_Iterable[_Union[AcceptanceMeasurement, _Mapping]]] = ..., similarity: _Optional[_Iterable[_Union[SimilarityMeasurement, _Mapping]]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    def __init__(self, stored: _Optional[bool] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ForwardLatency(_message.Message):
    __slots__ = ("model", "batch_size_bucket", "tokens_per_row_bucket", "ema_forward_ns", "samples")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_BUCKET_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_ROW_BUCKET_FIELD_NUMBER: _ClassVar[int]
    EMA_FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    model: str
    batch_size_bucket: int
    tokens_per_row_bucket: int
    ema_forward_ns: float
    samples: int
    def __init__(self, model: _Optional[str] = ..., batch_size_bucket: _Optional[int] = ..., tokens_per_row_bucket: _Optional[int] = ..., ema_forward_ns: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...

class AcceptanceRate(_message.Message):
    __slots__ = ("drafter", "verifier", "mode", "position", "ema_acceptance_rate", "accepted_total", "proposed_total", "samples")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    EMA_ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    drafter: str
    verifier: str
    mode: DecodingMode
    position: int
    ema_acceptance_rate: float
    accepted_total: int
    proposed_total: int
    samples: int
    def __init__(self, drafter: _Optional[str] = ..., verifier: _Optional[str] = ..., mode: _Optional[_Union[DecodingMode, str]] = ..., position: _Optional[int] = ..., ema_acceptance_rate: _Optional[float] = ..., accepted_total: _Optional[int] = ..., proposed_total: _Optional[int] = ..., samples: _Optional[int] = ...) -> None: ...

class Similarity(_message.Message):
    __slots__ = ("drafter", "verifier", "ema_similarity", "samples", "mode", "positions_total")
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    EMA_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    drafter: str
    verifier: str
    ema_similarity: float
    samples: int
    mode: DecodingMode
    positions_total: int
    def __init__(self, drafter: _Optional[str] = ..., verifier: _Optional[str] = ..., ema_similarity: _Optional[float] = ..., samples: _Optional[int] = ..., mode: _Optional[_Union[DecodingMode, str]] = ..., positions_total: _Optional[int] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("forward", "acceptance", "similarity", "stale", "age_ms", "ema_alpha", "reports_dropped", "acceptance_alpha")
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    EMA_ALPHA_FIELD_NUMBER: _ClassVar[int]
    REPORTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_ALPHA_FIELD_NUMBER: _ClassVar[int]
    forward: _containers.RepeatedCompositeFieldContainer[ForwardLatency]
    acceptance: _containers.RepeatedCompositeFieldContainer[AcceptanceRate]
    similarity: _containers.RepeatedCompositeFieldContainer[Similarity]
    stale: bool
    age_ms: int
    ema_alpha: float
    reports_dropped: int
    acceptance_alpha: float
    def __init__(self, forward: _Optional[_Iterable[_Union[ForwardLatency, _Mapping]]] = ..., acceptance: _Optional[_Iterable[_Union[AcceptanceRate, _Mapping]]] = ..., similarity: _Optional[_Iterable[_Union[Similarity, _Mapping]]] = ..., stale: _Optional[bool] = ..., age_ms: _Optional[int] = ..., ema_alpha: _Optional[float] = ..., reports_dropped: _Optional[int] = ..., acceptance_alpha: _Optional[float] = ...) -> None: ...
