"""The router as the gateway calls it: gRPC (asyncio), each call with the caller's bearer token and the
trace context of the gateway's span, under the gateway's deadline."""

from __future__ import annotations

import time

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import propagate

from specrouter.client import CHANNEL_OPTIONS
from specrouter.tls import ClientTLS, aio_channel
from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc

HEALTH_TIMEOUT_S = 5.0


class Router:
    """One channel to the router (or routers), opened in the event loop that uses it."""

    def __init__(self, address: str, tls: ClientTLS | None, timeout_s: float, models_refresh_s: float):
        self.channel = aio_channel(address, tls, options=CHANNEL_OPTIONS)
        self.stub = router_pb2_grpc.RouterServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.timeout_s = timeout_s
        self.models_refresh_s = models_refresh_s
        self._models: tuple[float, pb.ListModelsResponse] | None = None

    @staticmethod
    def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)   # traceparent: the router's spans join the gateway's trace
        if token:
            carrier["authorization"] = f"Bearer {token}"
        return tuple(carrier.items())

    async def generate(self, request: pb.GenerateRequest, token: str | None) -> pb.GenerateResponse:
        return await self.stub.Generate(request, timeout=self.timeout_s, metadata=self.metadata(token))

    def stream(self, request: pb.GenerateRequest, token: str | None) -> grpc.aio.UnaryStreamCall:
        """The call, started; read it with `read()`, cancel it with `cancel()`."""
        return self.stub.GenerateStream(request, timeout=self.timeout_s, metadata=self.metadata(token))

    async def models(self, token: str | None, fresh: bool = False) -> pb.ListModelsResponse:
        """The pool's models; the answer is reused for `models_refresh_s` unless `fresh`."""
        now = time.monotonic()
        if not fresh and self._models is not None and now - self._models[0] < self.models_refresh_s:
            return self._models[1]
        reply = await self.stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout_s,
                                           metadata=self.metadata(token))
        self._models = (now, reply)
        return reply

    async def serving(self) -> tuple[bool, str]:
        """Whether the router says it serves (the standard health service), and its status or why not."""
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(), timeout=HEALTH_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        return reply.status == health_pb2.HealthCheckResponse.SERVING, status

    async def close(self) -> None:
        await self.channel.close()
