"""SpecRouter: lossless, adaptive, multi-level speculative decoding served over gRPC."""

__version__ = "0.1.0"

from specrouter.client import (  # noqa: E402
    AsyncClient,
    Client,
    ClientTLS,
    DeadlineExceededError,
    GenerationResult,
    InvalidRequestError,
    OverloadedError,
    SpecRouterError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = ["AsyncClient", "Client", "ClientTLS", "DeadlineExceededError", "GenerationResult", "InvalidRequestError",
           "OverloadedError", "SpecRouterError", "UnauthenticatedError", "UnavailableError"]
