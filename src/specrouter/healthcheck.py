"""`specrouter healthcheck ADDRESS`: asks a server over the standard gRPC health protocol whether it serves.

Every SpecRouter server carries the stock health service (`grpc.health.v1.Health`): a worker turns
SERVING once its model is loaded and warmed up, the router and the profiler as soon as they listen. The
command is what container healthchecks run, and a person can run it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrouter.tls import ClientTLS, channel as open_channel

DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Health:
    serving: bool
    reason: str   # one line: "SERVING", or why not


def check(address: str, service: str = "", timeout_s: float = DEFAULT_TIMEOUT_S, tls: ClientTLS | None = None,
          ) -> Health:
    """Asks `address` (HOST:PORT) for the status of `service` ('' is the server as a whole); over TLS with
    `tls` (a worker or profiler with TLS on wants a client certificate too)."""
    what = f"service {service!r} at {address}" if service else address
    with open_channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            return Health(False, _failure(exc, what, timeout_s))
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        return Health(True, f"{what}: SERVING")
    return Health(False, f"{what} is {status}")


def _failure(exc: grpc.RpcError, what: str, timeout_s: float) -> str:
    code, details = exc.code(), (exc.details() or "").splitlines()
    detail = f" ({details[0]})" if details else ""
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{what} is unreachable{detail}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{what} did not answer within {timeout_s:g} s"
    if code == grpc.StatusCode.NOT_FOUND:
        return f"{what}: the server does not know this service name"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"{what} has no gRPC health service"
    return f"{what}: health check failed with {code.name}{detail}"


def check_http(url: str, timeout_s: float = DEFAULT_TIMEOUT_S, ca: str | None = None) -> Health:
    """GETs `url` (the gateway's /health): serving if it answers 200; over HTTPS, `ca` signs the server's
    certificate (else the system's CAs)."""
    import json
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=ca) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            return Health(True, f"{url}: {response.status}")
    except urllib.error.HTTPError as exc:
        try:   # the gateway says why in OpenAI's error shape
            detail = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = exc.reason
        return Health(False, f"{url} answered {exc.code}: {detail}")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
            return Health(False, f"{url} did not answer within {timeout_s:g} s")
        return Health(False, f"{url} is unreachable ({reason})")
