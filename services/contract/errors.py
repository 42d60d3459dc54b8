"""What a worker call can fail with, and the gRPC status each failure travels as.

The engine raises these in process; the worker's server answers a call that raised one with
`status_for`'s code, naming the rows at fault in the trailing metadata where the failure is theirs alone,
and the router reads an engine's error in process through the same mapping as a status over the wire.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import grpc


class StateError(ValueError):
    """A state operation that the state cannot honour (too long a rollback, unknown rows, ...)."""


class UnknownStateError(KeyError):
    """No state with this id (never created, released, or reclaimed after its TTL)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown state"


class RowError(ValueError):
    """A call that cannot be honoured for some of its rows (`row_ids`), for reasons of those rows alone. It
    is raised before the call changes anything, so the same call without those rows can go ahead."""

    def __init__(self, message: str, row_ids: Sequence[str]):
        super().__init__(message)
        self.row_ids = tuple(row_ids)


class RowStateError(RowError, StateError):
    """Rows whose state cannot honour the call: not in the state, too long a rollback, no pending token."""


class ContextLengthError(RowStateError):
    """Rows would grow past the model's context length."""


# A call that fails for some of its rows alone (the engine's RowError) names them in its trailing metadata,
# so that the router ends those requests and goes on with the others.
FAILED_ROWS_KEY = "specrouter-failed-rows-bin"


def failed_rows_to_metadata(row_ids: Sequence[str]) -> tuple[tuple[str, bytes], ...]:
    return ((FAILED_ROWS_KEY, json.dumps(list(row_ids)).encode()),)


def failed_rows_from_metadata(metadata) -> tuple[str, ...]:
    """The rows a failed call names; none when it failed as a whole."""
    for key, value in metadata or ():
        if key == FAILED_ROWS_KEY:
            try:
                rows = json.loads(value)
            except ValueError:
                return ()
            return tuple(r for r in rows if isinstance(r, str)) if isinstance(rows, list) else ()
    return ()


CPU_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory"
TORCH_OUT_OF_MEMORY = "torch.OutOfMemoryError"


def out_of_memory(exc: Exception) -> bool:
    """Whether `exc` is the device running out of memory: Python's MemoryError, torch's OutOfMemoryError
    (CUDA), or the RuntimeError torch's CPU allocator raises when the system refuses an allocation."""
    return (isinstance(exc, MemoryError) or _is_torch_out_of_memory(exc)
            or (isinstance(exc, RuntimeError) and CPU_ALLOCATION_FAILED in str(exc)))


def _is_torch_out_of_memory(exc: Exception) -> bool:
    """Whether `exc` is torch's OutOfMemoryError, told by its class's name: this package never imports torch
    (an engine in this process that raises one has imported it already)."""
    return any(f"{c.__module__}.{c.__qualname__}" == TORCH_OUT_OF_MEMORY for c in type(exc).__mro__)


def status_for(exc: Exception) -> grpc.StatusCode:
    """The one place where a call's errors become gRPC status codes: the worker's server answers with it, and
    the router reads an engine's error in process with it as it would the status over the wire."""
    if out_of_memory(exc):   # the router makes the batch smaller
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, UnknownStateError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, ContextLengthError):
        return grpc.StatusCode.OUT_OF_RANGE
    if isinstance(exc, StateError):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL
