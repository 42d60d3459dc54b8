"""The client SDK: `Client` (blocking) and `AsyncClient` (asyncio) for the router's gRPC API.

    from specrouter import Client
    with Client("127.0.0.1:50051") as client:
        result = client.generate("def fibonacci(n):", max_new_tokens=32)
        print(result.text, result.finish_reason, result.stats.cycles)

Calls that find the router UNAVAILABLE are retried by gRPC's own retry policy (service config). The address
may name several routers: `dns:///router-pods.specrouter.svc:50051` (a headless Service) or a HOST:PORT
whose name resolves to several addresses; calls are spread over all of them, round robin.

A router with TLS and a bearer token (docs/deployment.md, "TLS and tokens"):

    from specrouter import Client, ClientTLS
    tls = ClientTLS.from_files(ca="ca.pem")    # and cert=, key= where the router requires mutual TLS
    with Client("router.example:50051", tls=tls, token_file="router.token") as client: ...

Without `token` or `token_file`, the token is the SPECROUTER_TOKEN environment variable's, if set.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
from google.protobuf.descriptor import FieldDescriptor

from specrouter.tls import ClientTLS, CredentialsError, aio_channel, channel
from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["RouterService"].full_name
SERVICE_CONFIG = {
    # every address the target resolves to gets calls in turn (routers are stateless: any can take any call)
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [{
        "name": [{"service": SERVICE}],
        "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.2s", "maxBackoff": "2s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
    }]
}
CHANNEL_OPTIONS = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(SERVICE_CONFIG))]
TOKEN_ENV = "SPECROUTER_TOKEN"


class SpecRouterError(Exception):
    """A call failed; `code` is the gRPC status, the message is the server's."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code, self.message = code, message


class InvalidRequestError(SpecRouterError):
    """The request was refused as given (INVALID_ARGUMENT, OUT_OF_RANGE)."""


class UnavailableError(SpecRouterError):
    """The router or a worker cannot be reached (UNAVAILABLE), after retries."""


class DeadlineExceededError(SpecRouterError):
    """The call's deadline passed (DEADLINE_EXCEEDED)."""


class CancelledError(SpecRouterError):
    """The call was cancelled (CANCELLED)."""


class OverloadedError(SpecRouterError):
    """RESOURCE_EXHAUSTED: the router's line of waiting requests is full (nothing ran; send it again later, or
    to another router), or a worker ran out of memory for this request alone (send less)."""


class UnauthenticatedError(SpecRouterError):
    """The router wants a bearer token and got none, or another one (UNAUTHENTICATED): pass `token=` or
    `token_file=`, or set SPECROUTER_TOKEN."""


_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError, grpc.StatusCode.OUT_OF_RANGE: InvalidRequestError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError, grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.CANCELLED: CancelledError, grpc.StatusCode.RESOURCE_EXHAUSTED: OverloadedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def _error(exc: grpc.RpcError) -> SpecRouterError:
    code = exc.code()
    return _ERRORS.get(code, SpecRouterError)(code, exc.details() or "")


@dataclass(frozen=True)
class LevelTiming:
    """One model's calls in a request's cycles, summed, in nanoseconds."""

    calls: int = 0
    call_ns: int = 0      # round trips as the router saw them (serialization, transport, handler)
    handler_ns: int = 0   # the worker's handler (decode, engine, encode)
    forward_ns: int = 0   # the model's forward passes alone


@dataclass(frozen=True)
class CycleBreakdown:
    """Where the router spent a request's time, in nanoseconds; a cycle counts once for each of its rows."""

    cycle_ns: int = 0     # the request's cycles, from the chain's choice to the tokens handed on
    choose_ns: int = 0    # choosing the chain and window (part of cycle_ns)
    prefill_ns: int = 0   # the request's prefill round
    levels: dict[str, LevelTiming] = field(default_factory=dict)
    # a pipelined router: the drafter's ahead drafts, each beside a cycle's verifiers (not in `levels`), and
    # the cycles whose proposal one of them made; the other ahead drafts were thrown away
    ahead: LevelTiming = field(default_factory=LevelTiming)
    cycles_from_ahead: int = 0
    # prefilling the request on a model that joined it late (the router's `prefill_recent_cycles`; part of
    # cycle_ns)
    late_prefill_ns: int = 0

    @classmethod
    def from_pb(cls, m: pb.CycleBreakdown) -> CycleBreakdown:
        def timing(t: pb.LevelTiming) -> LevelTiming:
            return LevelTiming(t.calls, t.call_ns, t.handler_ns, t.forward_ns)

        return cls(m.cycle_ns, m.choose_ns, m.prefill_ns, {name: timing(t) for name, t in m.levels.items()},
                   timing(m.ahead), m.cycles_from_ahead, m.late_prefill_ns)


@dataclass(frozen=True)
class GenerationStats:
    cycles: int = 0
    chain_counts: dict[str, int] = field(default_factory=dict)
    accepted_per_level: dict[str, float] = field(default_factory=dict)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    queue_ns: int = 0
    total_ns: int = 0
    seed: int = 0
    breakdown: CycleBreakdown = field(default_factory=CycleBreakdown)

    @classmethod
    def from_pb(cls, m: pb.GenerationStats) -> GenerationStats:
        return cls(m.cycles, dict(m.chain_counts), dict(m.accepted_per_level), m.prompt_tokens,
                   m.generated_tokens, m.queue_ns, m.total_ns, m.seed, CycleBreakdown.from_pb(m.breakdown))


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: GenerationStats


@dataclass(frozen=True)
class Chunk:
    text: str
    token_ids: list[int]
    finish_reason: str = ""              # set on the last chunk
    stats: GenerationStats | None = None  # set on the last chunk


@dataclass(frozen=True)
class ModelInfo:
    name: str
    parameters: int
    role: str
    address: str


def _request(prompt: str, max_new_tokens: int | None = None, temperature: float = 0.0, top_p: float | None = None,
             top_k: int = 0, repetition_penalty: float | None = None, seed: int | None = None,
             stop: Sequence[str] = (), chain: str = "auto", window: int = 0) -> pb.GenerateRequest:
    """The request message; a value its field cannot hold (a negative count, a seed past 64 bits, a
    string where a number goes) is refused here, by name, as the router refuses the values it can hold."""
    fields = dict(prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                  top_k=top_k, repetition_penalty=repetition_penalty, seed=seed, chain=chain, window=window)
    request = pb.GenerateRequest()
    for name, value in fields.items():
        if value is None:   # optional fields left unset take the router's defaults
            continue
        try:
            setattr(request, name, value)
        except (TypeError, ValueError) as exc:
            kind = request.DESCRIPTOR.fields_by_name[name].type
            unsigned = kind in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64)
            hint = " (it cannot be negative)" if unsigned and isinstance(value, int) and value < 0 else ""
            raise InvalidRequestError(grpc.StatusCode.INVALID_ARGUMENT,
                                      f"{name}={value!r} cannot be sent{hint}: {exc}") from None
    try:
        request.stop.extend([stop] if isinstance(stop, str) else stop)   # one stop string, or several
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"stop must be a list of strings, got {stop!r}: {exc}") from None
    return request


def resolve_token(token: str | None = None, token_file: str | os.PathLike | None = None) -> str | None:
    """The bearer token to send: `token`, else what `token_file` holds, else $SPECROUTER_TOKEN, else None (no
    token sent); surrounding whitespace (a file's last newline) is not part of it."""
    if token is None and token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialsError(f"cannot read the token file {token_file}: {getattr(exc, 'strerror', None) or exc}"
                                 ) from None
        if not token.strip():
            raise CredentialsError(f"the token file {token_file} is empty")
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    return token.strip() if token is not None else None


def _metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None


def _result(m: pb.GenerateResponse) -> GenerationResult:
    return GenerationResult(m.text, list(m.token_ids), m.finish_reason, GenerationStats.from_pb(m.stats))


def _chunk(m: pb.GenerateChunk) -> Chunk:
    return Chunk(m.text, list(m.token_ids), m.finish_reason,
                 GenerationStats.from_pb(m.stats) if m.HasField("stats") else None)


class Client:
    """A router's API, blocking. `tls`: connect over TLS (else plaintext); `token` or `token_file`: the
    bearer token every call carries (default: $SPECROUTER_TOKEN, if set; `token=""` sends none)."""

    def __init__(self, address: str, timeout_s: float | None = 300.0, *, tls: ClientTLS | None = None,
                 token: str | None = None, token_file: str | os.PathLike | None = None):
        self.channel = channel(address, tls, options=CHANNEL_OPTIONS)
        self.stub = router_pb2_grpc.RouterServiceStub(self.channel)
        self.timeout_s = timeout_s
        self._metadata = _metadata(resolve_token(token, token_file))

    def generate(self, prompt: str, **params) -> GenerationResult:
        try:
            return _result(self.stub.Generate(_request(prompt, **params), timeout=self.timeout_s,
                                              metadata=self._metadata))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def generate_stream(self, prompt: str, **params) -> Iterator[Chunk]:
        try:
            for m in self.stub.GenerateStream(_request(prompt, **params), timeout=self.timeout_s,
                                              metadata=self._metadata):
                yield _chunk(m)
        except grpc.RpcError as exc:
            raise _error(exc) from None

    def models(self, levels: bool = False) -> list[ModelInfo]:
        """The pool's models, smallest first; with `levels`, then the levels that draft without a model (the
        lookup: no parameters, no address), which may start a named chain."""
        try:
            reply = self.stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise _error(exc) from None
        found = [*reply.models, *(reply.levels if levels else ())]
        return [ModelInfo(m.name, m.parameters, m.role, m.address) for m in found]

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """`Client` for asyncio, with the same `tls`, `token` and `token_file`."""

    def __init__(self, address: str, timeout_s: float | None = 300.0, *, tls: ClientTLS | None = None,
                 token: str | None = None, token_file: str | os.PathLike | None = None):
        self.channel = aio_channel(address, tls, options=CHANNEL_OPTIONS)
        self.stub = router_pb2_grpc.RouterServiceStub(self.channel)
        self.timeout_s = timeout_s
        self._metadata = _metadata(resolve_token(token, token_file))

    async def generate(self, prompt: str, **params) -> GenerationResult:
        try:
            return _result(await self.stub.Generate(_request(prompt, **params), timeout=self.timeout_s,
                                                    metadata=self._metadata))
        except grpc.RpcError as exc:
            raise _error(exc) from None

    async def generate_stream(self, prompt: str, **params) -> AsyncIterator[Chunk]:
        try:
            async for m in self.stub.GenerateStream(_request(prompt, **params), timeout=self.timeout_s,
                                                    metadata=self._metadata):
                yield _chunk(m)
        except grpc.RpcError as exc:
            raise _error(exc) from None

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
