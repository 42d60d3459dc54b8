"""The one place where failures become HTTP answers: OpenAI's error shape
`{"error": {"message", "type", "param", "code"}}` with the status a client acts on.

The router's gRPC status codes map to HTTP statuses here; the router's message is kept, since it says what
to change (with the request's field names as this API spells them).
"""

from __future__ import annotations

import grpc
from starlette.responses import JSONResponse

from specrouter.gateway.settings import setting_hint

INVALID_REQUEST = "invalid_request_error"

# gRPC status -> (HTTP status, OpenAI error type)
_STATUSES = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, INVALID_REQUEST),
    grpc.StatusCode.OUT_OF_RANGE: (400, INVALID_REQUEST),
    grpc.StatusCode.FAILED_PRECONDITION: (400, INVALID_REQUEST),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, INVALID_REQUEST),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.CANCELLED: (503, "service_unavailable_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "server_error"),
}
RETRY_AFTER_S = 1   # what a 429 or a 503 suggests to wait before sending again
# the router's words for fields that this API names otherwise
_FIELD_NAMES = (("max_new_tokens", "max_tokens"),)


class APIError(Exception):
    """A request that ends with an HTTP error; `message` says what to do about it."""

    def __init__(self, status: int, message: str, type_: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"retry-after": str(RETRY_AFTER_S)} if self.status in (429, 503) else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, INVALID_REQUEST, param, code)


def from_grpc(exc: grpc.aio.AioRpcError) -> APIError:
    """The HTTP error for a router call that ended with a status other than OK."""
    code = exc.code()
    status, type_ = _STATUSES.get(code, (500, "server_error"))
    message = exc.details() or code.name
    param = None
    if status == 400:
        for router_name, name in _FIELD_NAMES:
            if message.startswith(router_name):
                message, param = name + message[len(router_name):], name
    if code == grpc.StatusCode.UNAUTHENTICATED:   # the router speaks of gRPC metadata; say it in HTTP's terms
        message = (f"the router refused the request: {message}. Send the router's token in the header "
                   "'Authorization: Bearer <token>' (the openai client's api_key)")
    elif code == grpc.StatusCode.UNAVAILABLE:
        message = f"the router cannot serve now: {message}"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        message = (f"the router did not finish in time: {message}; ask for fewer tokens, or have the operator "
                   f"raise the deadline with {setting_hint('request_timeout_s')}")
    elif status == 500:
        message = f"the router failed: {code.name}: {message}"
    return APIError(status, message, type_, param, code.name.lower())
