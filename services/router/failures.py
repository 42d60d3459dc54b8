"""What a worker's error means for a batch and its requests.

A call to a worker can fail for the whole call (the worker is gone, it ran out of memory, a bug) or for
some of its rows alone (a row past the model's context, a state the worker lost). The chain raises
`WorkerCallFailed` or `RowsFailed`; the batcher, the placement of replicas and the server read them with
the predicates here, so that every part of the router tells the same failures apart the same way, and
`row_failure` says what the client of a row that ended alone is told.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from specrouter.contract import errors


class WorkerCallFailed(RuntimeError):
    """A call to one model's worker failed: `model` names it, `cause` is the worker's own error."""

    def __init__(self, model: str, cause: BaseException):
        super().__init__(f"{model}: {cause}")
        self.model, self.cause = model, cause


class RowsFailed(WorkerCallFailed):
    """`model`'s worker refused a call for some of its rows alone (`row_ids`: a context overflow, a row its
    state does not hold, a token it cannot take), before changing anything. The cycle emitted nothing, so
    the other rows can run it again, with the same output."""

    def __init__(self, model: str, cause: BaseException, row_ids: Sequence[str]):
        super().__init__(model, cause)
        self.row_ids = tuple(row_ids)


class StateOutOfLine(WorkerCallFailed):
    """`model`'s worker holds a state of the batch other than the router's rows (it lost it, or holds rows or
    lengths the call does not name). No row is at fault: the batch rebuilds that state from the rows' tokens
    before its next call to the worker and runs the cycle again, with the same output."""


class OutOfMemory(RuntimeError):
    """A worker ran out of memory for a batch that could not be made any smaller: its client gets
    RESOURCE_EXHAUSTED."""


def out_of_memory(cause: BaseException) -> bool:
    """Whether a worker's error says it ran out of memory: RESOURCE_EXHAUSTED from a remote worker, the
    allocator's own error (`errors.out_of_memory`) from an engine in this process. Such a call
    may have stopped half way through, so the rows' states on that worker are no longer known."""
    return _code(cause) == grpc.StatusCode.RESOURCE_EXHAUSTED


def _code(cause: BaseException) -> grpc.StatusCode:
    """The status of a worker's error: a remote worker's own, an engine's in process as it would answer."""
    return cause.code() if isinstance(cause, grpc.Call) else errors.status_for(cause)


def state_unknown(cause: BaseException) -> bool:
    """Whether a worker's error says it holds no state of that id (released, expired, or it restarted)."""
    return _code(cause) == grpc.StatusCode.NOT_FOUND


def state_out_of_line(cause: BaseException) -> bool:
    """Whether a worker's error says its state is not what the call expects: no state of that id (NOT_FOUND),
    or rows or lengths other than the call's (FAILED_PRECONDITION: a row it does not hold, rows the call does
    not name, a rollback past a row's length, a row it holds already). Rebuilding the state from the rows'
    tokens answers it; a row past the model's context (OUT_OF_RANGE) or a token it cannot take
    (INVALID_ARGUMENT) is the row's own fault, and is not this."""
    return _code(cause) in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def worker_gone(cause: BaseException) -> bool:
    """Whether a worker's error says the worker is gone rather than that it refused the call: a remote
    worker's UNAVAILABLE or DEADLINE_EXCEEDED (unreachable, or silent past the call's deadline), an
    in-process stand-in's ConnectionError. A refusal (a row past its context, out of memory, a bug) is not:
    another replica of the model would refuse the same."""
    if isinstance(cause, grpc.Call):
        return cause.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return isinstance(cause, ConnectionError)


class RowFailed(RuntimeError):
    """A request ended alone, by a fault of its own row; the rest of its batch went on. `code` is the gRPC
    status its client gets."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def failed_rows(cause: BaseException) -> tuple[str, ...]:
    """The rows a worker's error names as the only ones it failed for (none: the call failed as a whole).
    An in-process engine's `RowError` carries them; a remote worker's error, its trailing metadata."""
    if isinstance(cause, grpc.Call):
        return errors.failed_rows_from_metadata(cause.trailing_metadata())
    return tuple(getattr(cause, "row_ids", ()))


_ROW_ADVICE = {
    grpc.StatusCode.OUT_OF_RANGE: "shorten the prompt or ask for fewer new tokens",
    grpc.StatusCode.INVALID_ARGUMENT: "send only token ids of the pool's tokenizer",
    grpc.StatusCode.UNAVAILABLE: "retry the request",
}


def row_failure(exc: RowsFailed) -> RowFailed:
    """What the client of a row of `exc` is told. A worker's context is OUT_OF_RANGE and a token it cannot
    take INVALID_ARGUMENT; a row whose state the worker lost or holds out of step is UNAVAILABLE: the
    request, sent again, starts with a fresh state."""
    if isinstance(exc.cause, grpc.Call):
        worker_code, details = exc.cause.code(), exc.cause.details()
    else:
        worker_code, details = errors.status_for(exc.cause), str(exc.cause)   # an engine in this process
    code = worker_code if worker_code in _ROW_ADVICE else grpc.StatusCode.UNAVAILABLE
    return RowFailed(code, f"the worker of {exc.model} cannot go on with this request ({details}); {_ROW_ADVICE[code]}")
