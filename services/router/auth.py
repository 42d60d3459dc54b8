"""Who may talk to whom: the bearer token on the router's public API, and the router's TLS to its workers
and the profiler.

With a token configured, every call of RouterService must carry the metadata
`authorization: Bearer <token>`; one without it, or with another token, ends UNAUTHENTICATED before
the servicer sees it. The standard health service and reflection stay open, so that probes and
`grpcurl list` work without the secret. Tokens are compared in constant time (hmac.compare_digest).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import grpc

from specrouter.router.settings import ENV_PREFIX, RouterSettings, setting_hint
from specrouter.tls import ClientTLS, CredentialsError, setting_hint as tls_hint

AUTHORIZATION = "authorization"   # gRPC metadata keys are lower case
SCHEME = "bearer"


def load_token(settings: RouterSettings) -> str | None:
    """The router's token, from `auth_token_file` or SPECROUTER_ROUTER_AUTH_TOKEN; None: no token checked."""
    if settings.auth_token is not None:
        token = settings.auth_token.get_secret_value().strip()
        if not token:
            raise CredentialsError(f"{ENV_PREFIX}AUTH_TOKEN is set but empty; set a token or unset it")
        return token
    path = settings.auth_token_file
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsError(f"cannot read the token file {path}, given by {setting_hint('auth_token_file')}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise CredentialsError(f"the token file {path}, given by {setting_hint('auth_token_file')}, is empty")
    return token


def upstream_tls(settings: RouterSettings) -> ClientTLS | None:
    """TLS to the workers and the profiler, from the `upstream_*` settings; None: plaintext."""
    files = (settings.upstream_ca, settings.upstream_cert, settings.upstream_key)
    if all(f is None for f in files):
        return None
    return ClientTLS.from_files(*files, names=tuple(tls_hint(RouterSettings, n)
                                                    for n in ("upstream_ca", "upstream_cert", "upstream_key")))


def bearer_token(metadata) -> str | None:
    """The token of the call's `authorization: Bearer <token>` metadata, or None."""
    for key, value in metadata or ():
        if key == AUTHORIZATION and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == SCHEME and token.strip():
                return token.strip()
    return None


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls to `service` (its full name) that do not carry `token`; other services pass."""

    def __init__(self, service: str, token: str):
        self._prefix = f"/{service}/"
        self._token = token.encode("utf-8")

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails):
        handler = continuation(details)
        if handler is None or not details.method.startswith(self._prefix):
            return handler
        given = bearer_token(details.invocation_metadata)
        if given is None:
            return _refusing(handler, "this router requires a bearer token: send the metadata "
                                      "'authorization: Bearer <token>' (the SDK: Client(..., token=...) or the "
                                      "SPECROUTER_TOKEN environment variable; the CLI: --token-file)")
        if not hmac.compare_digest(given.encode("utf-8"), self._token):
            return _refusing(handler, "the bearer token was not accepted: it is not the token this router "
                                      "was given; check the one you send")
        return handler


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends the call UNAUTHENTICATED with `message`."""
    def refuse(_request, context: grpc.ServicerContext):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(refuse)   # no deserializer: the request of a caller refused is never decoded
