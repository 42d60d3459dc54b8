"""The profiler's domain errors, and the one place that maps them to gRPC status codes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc


class InvalidMeasurement(ValueError):
    """A measurement that cannot be right; the message names the field and what it should hold."""


class StoreUnavailable(ConnectionError):
    """The metric store could not be reached; the operation did not happen (or, after a timeout, may have)."""


_STATUS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidMeasurement, grpc.StatusCode.INVALID_ARGUMENT),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
)
_DOMAIN_ERRORS = tuple(kind for kind, _ in _STATUS)


def status_code(error: Exception) -> grpc.StatusCode | None:
    """The status a domain error maps to; None for anything else (a bug, reported as UNKNOWN by gRPC)."""
    return next((code for kind, code in _STATUS if isinstance(error, kind)), None)


@contextlib.contextmanager
def domain_errors(context: grpc.ServicerContext) -> Iterator[None]:
    """Aborts the call with the mapped status code when the block raises a domain error."""
    try:
        yield
    except _DOMAIN_ERRORS as error:
        context.abort(status_code(error), str(error))
