from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_name", "parameters", "vocab_size", "tokenizer_sha256", "context_length", "device", "dtype")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_SHA256_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    parameters: int
    vocab_size: int
    tokenizer_sha256: str
    context_length: int
    device: str
    dtype: str
    def __init__(self, model_name: _Optional[str] = ..., parameters: _Optional[int] = ..., vocab_size: _Optional[int] = ..., tokenizer_sha256: _Optional[str] = ..., context_length: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ...) -> None: ...
