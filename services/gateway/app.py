"""The OpenAI-compatible HTTP API over the router: `POST /v1/completions`, `POST /v1/chat/completions`
(whole answers, or server-sent events with `stream: true`), `GET /v1/models` and `GET /health`.

Each handler reads and checks the body (schemas.py), turns it into router requests, one per choice (`n`
per prompt; with a `seed`, choice i samples with seed + i), calls the router (upstream.py) and writes
the OpenAI body (responses.py). Failures become OpenAI-shaped errors in one place (errors.py). A client
that leaves before its answer is complete cancels the router's requests: a stream's on its next
chunk or at once (the server tells the app), a whole answer's as soon as the connection closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import grpc
import grpc.aio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specrouter.gateway import chat, responses
from specrouter.gateway.chat import ChatTemplate
from specrouter.gateway.errors import APIError, bad_request, from_grpc
from specrouter.gateway.observed import CLIENT_GONE, GatewayMetrics, Observed
from specrouter.gateway.responses import CHAT, COMPLETION, Kind
from specrouter.gateway.schemas import INT64, ChatRequest, CompletionRequest, Sampling, parse
from specrouter.gateway.settings import GatewaySettings, setting_hint
from specrouter.gateway.stops import StreamCutter, cut
from specrouter.gateway.upstream import Router
from specrouter.tls import ClientTLS
from specrouter.v1 import router_pb2 as pb

log = logging.getLogger(__name__)
SSE_DONE = b"data: [DONE]\n\n"


class ClientGone(Exception):
    """The client closed the connection before its answer was complete."""


@dataclass
class Gateway:
    """What the handlers share: the settings, the router (opened with the app), the chat template."""

    settings: GatewaySettings
    template: ChatTemplate | None
    metrics: GatewayMetrics
    tls: ClientTLS | None = None
    router: Router | None = None
    started: int = 0

    async def target(self, name: str, token: str | None) -> str:
        """The router's name for the model the request names: the pool's target, by its name or an alias."""
        reply = await self.router.models(token)
        target = next(m.name for m in reply.models if m.role == "target")
        if name == target or name in self.settings.model_aliases:
            return target
        known = ", ".join(repr(n) for n in (target, *self.settings.model_aliases))
        raise APIError(404, f"the model {name!r} does not exist here; this gateway serves {known} (GET /v1/models)",
                       param="model", code="model_not_found")


def bearer_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def read_json(request: Request, limit: int):
    """The body, decoded; 413 past `limit` bytes (read no further), 400 when it is not JSON."""
    too_large = APIError(413, f"the request body is over {limit} bytes; send a shorter prompt, or have the operator "
                              f"raise {setting_hint('max_body_bytes')}", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise too_large
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text: send JSON", code="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
                          code="invalid_json") from None


def _no_constant(name: str):
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


async def unless_gone(request: Request, work: Awaitable):
    """`work`'s result, unless the client disconnects first: then `work` is cancelled and ClientGone raised."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:   # this handler itself cancelled
        task.cancel()
        raise
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        await asyncio.wait({task})   # its calls cancelled before the answer goes
        raise ClientGone()
    return task.result()


async def every(calls: Sequence[Awaitable]) -> list:
    """Awaits every call; the first failure cancels the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        raise


def router_requests(prompts: Sequence[str], p: Sampling, max_tokens: int | None) -> list[pb.GenerateRequest]:
    """One router request per choice: the `n` choices of each prompt in turn."""
    out = []
    for prompt in prompts:
        for choice in range(p.n):
            r = pb.GenerateRequest(prompt=prompt, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k,
                                   chain=p.chain, window=p.window, stop=p.stops())
            if max_tokens is not None:
                r.max_new_tokens = max_tokens
            if p.seed is not None:   # the choices of one seed differ from each other, and repeat with it
                r.seed = (p.seed + choice + INT64) % (2 * INT64) - INT64
            if p.repetition_penalty is not None:
                r.repetition_penalty = p.repetition_penalty
            out.append(r)
    return out


def endpoint(handler: Callable[[Gateway, Request], Awaitable[Response]]):
    """A route's function: the handler, with every failure turned into an OpenAI error here."""
    async def route(request: Request) -> Response:
        gateway: Gateway = request.app.state.gateway
        try:
            return await handler(gateway, request)
        except APIError as exc:
            return exc.response()
        except grpc.aio.AioRpcError as exc:
            gateway.metrics.router_errors.labels(exc.code().name).inc()
            return from_grpc(exc).response()
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
    return route


async def completions(gateway: Gateway, request: Request) -> Response:
    p = parse(CompletionRequest, await read_json(request, gateway.settings.max_body_bytes))
    return await generate(gateway, request, COMPLETION, p, p.prompts(), p.max_tokens)


async def chat_completions(gateway: Gateway, request: Request) -> Response:
    p = parse(ChatRequest, await read_json(request, gateway.settings.max_body_bytes))
    if gateway.template is None:
        raise chat.no_template(p.model)
    prompt = gateway.template.render([{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                                      for m in p.messages])
    return await generate(gateway, request, CHAT, p, [prompt], p.new_tokens())


async def generate(gateway: Gateway, request: Request, kind: Kind, p: Sampling, prompts: Sequence[str],
                   max_tokens: int | None) -> Response:
    choices = len(prompts) * p.n
    if choices > gateway.settings.max_choices:
        raise bad_request(f"the request asks for {choices} choices (n times the prompts); this gateway gives at most "
                          f"{gateway.settings.max_choices}", "n")
    token = bearer_token(request)
    model_name = p.model
    await unless_gone(request, gateway.target(model_name, token))
    calls = router_requests(prompts, p, max_tokens)
    if p.stream:
        include_usage = p.stream_options is not None and p.stream_options.include_usage
        return await stream(gateway, request, kind, model_name, calls, token, p.stops(), p.n, include_usage)
    replies = await unless_gone(request, every([gateway.router.generate(c, token) for c in calls]))
    texts = [cut(r.text, p.stops()) if r.finish_reason == "stop" else r.text for r in replies]
    return JSONResponse(responses.whole(kind, responses.new_id(kind), model_name, replies, texts, p.n))


async def stream(gateway: Gateway, request: Request, kind: Kind, model: str, requests: Sequence[pb.GenerateRequest],
                 token: str | None, stops: Sequence[str], n: int, include_usage: bool) -> Response:
    """Server-sent events. The router's first chunk of every choice is awaited before the answer starts, so a
    request the router refuses gets its HTTP status rather than an error inside a stream."""
    calls = [gateway.router.stream(r, token) for r in requests]
    try:
        firsts = await unless_gone(request, every([c.read() for c in calls]))
    except BaseException:
        for c in calls:
            c.cancel()
        raise
    events = _events(gateway, kind, responses.new_id(kind), model, calls, firsts, stops, n, include_usage)
    return StreamingResponse(events, media_type="text/event-stream", headers={"cache-control": "no-cache"})


def _sse(body: dict) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _events(gateway: Gateway, kind: Kind, request_id: str, model: str, calls: Sequence[grpc.aio.UnaryStreamCall],
                  firsts: Sequence, stops: Sequence[str], n: int, include_usage: bool) -> AsyncIterator[bytes]:
    """The choices' chunks as the router sends them, interleaved; every call is cancelled when the stream ends
    early (the client left: the server cancels this generator, or closes it at its next chunk)."""
    created = int(time.time())
    arrived: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, call, message) -> None:
        try:
            while message is not grpc.aio.EOF:
                await arrived.put((index, message))
                message = await call.read()
        except grpc.aio.AioRpcError as exc:
            await arrived.put((index, exc))
            return
        await arrived.put((index, None))

    pumps = [asyncio.ensure_future(pump(i, c, m)) for i, (c, m) in enumerate(zip(calls, firsts))]
    cutters = [StreamCutter(stops) for _ in calls]
    final: list[pb.GenerationStats | None] = [None] * len(calls)
    try:
        open_calls, first = len(calls), [True] * len(calls)
        while open_calls:
            index, message = await arrived.get()
            if message is None:
                open_calls -= 1
                continue
            if isinstance(message, grpc.aio.AioRpcError):   # the router failed the request after it began
                gateway.metrics.router_errors.labels(message.code().name).inc()
                yield _sse(from_grpc(message).body())
                return
            text = cutters[index].feed(message.text)
            done = bool(message.finish_reason)
            if done:
                text += cutters[index].finish()
                final[index] = message.stats
            yield _sse(responses.chunk(kind, request_id, created, model, index, text, message.token_ids,
                                       message.finish_reason or None, first[index], message.stats if done else None))
            first[index] = False
        if include_usage:
            done_stats = [s for s in final if s is not None]
            usage = responses.usage(responses.prompt_tokens(done_stats, n), sum(s.generated_tokens for s in done_stats))
            yield _sse(responses.usage_chunk(kind, request_id, created, model, usage))
        yield SSE_DONE
    finally:
        for call in calls:
            call.cancel()
        for p in pumps:
            p.cancel()


async def models(gateway: Gateway, request: Request) -> Response:
    reply = await gateway.router.models(bearer_token(request), fresh=True)
    return JSONResponse(responses.model_list(reply, gateway.settings.model_aliases, gateway.started))


async def health(gateway: Gateway, request: Request) -> Response:
    """200 while the router says it serves; 503 with why not (a readiness probe's question)."""
    serving, status = await gateway.router.serving()
    if not serving:
        raise APIError(503, f"the router at {gateway.settings.router} does not serve: {status}",
                       "service_unavailable_error", code="router_unavailable")
    return JSONResponse({"status": "ok", "router": status})


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Unknown paths (404) and methods (405), in the same error shape as the rest."""
    message = {404: f"no route {request.url.path}: the API has POST /v1/completions, POST /v1/chat/completions, "
                    "GET /v1/models and GET /health",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
    return APIError(exc.status_code, message, code="not_found" if exc.status_code == 404 else None).response()


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return APIError(500, f"the gateway failed: {type(exc).__name__}: {exc}", "server_error").response()


def create_app(settings: GatewaySettings, template: ChatTemplate | None, tls: ClientTLS | None = None,
               metrics: GatewayMetrics | None = None):
    """The ASGI app, observed (observed.py); the router's channel opens and closes with it (its lifespan)."""
    gateway = Gateway(settings, template, metrics or GatewayMetrics(), tls)

    @asynccontextmanager
    async def lifespan(_app):
        gateway.router = Router(settings.router, tls, settings.request_timeout_s, settings.models_refresh_s)
        gateway.started = int(time.time())
        try:
            yield
        finally:
            await gateway.router.close()

    app = Starlette(routes=[
        Route("/v1/completions", endpoint(completions), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(chat_completions), methods=["POST"]),
        Route("/v1/models", endpoint(models), methods=["GET"]),
        Route("/health", endpoint(health), methods=["GET"]),
    ], exception_handlers={HTTPException: _http_error, Exception: _unexpected}, lifespan=lifespan)
    app.state.gateway = gateway
    return Observed(app, gateway.metrics)
