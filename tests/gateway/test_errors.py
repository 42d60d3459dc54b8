"""Bad input over HTTP gets the right status and an OpenAI-shaped error, and the gateway goes on serving;
the router's refusals map to their HTTP statuses: against the live cluster (401, 429, 504, 503, the router's
own 400s) and against a router of the test's own that answers each gRPC status on demand."""

from __future__ import annotations

import json
from concurrent import futures

import grpc
import httpx
import openai
import pytest

from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc
from tests.conftest import DEMO_POOL
from tests.gateway.conftest import MAX_IN_FLIGHT, TARGET, TOKEN, InProcessGateway, released, wait_until

AUTH = {"authorization": f"Bearer {TOKEN}"}
OK = {"model": TARGET, "prompt": "def f(x):", "max_tokens": 2, "temperature": 0}

BAD = [   # (path, body or raw bytes, status, param, words in the message)
    ("/v1/completions", b'{"model": "x", "prompt": ', 400, None, "not valid JSON"),
    ("/v1/completions", b"\xff\xfe", 400, None, "not UTF-8"),
    ("/v1/completions", b'{"model": "x", "prompt": "a", "temperature": NaN}', 400, None, "NaN is not a JSON number"),
    ("/v1/completions", [OK], 400, None, "must be a JSON object"),
    ("/v1/completions", {**OK, "model": "gpt-4"}, 404, "model", "does not exist here"),
    ("/v1/completions", {k: v for k, v in OK.items() if k != "prompt"}, 400, "prompt", "prompt is required"),
    ("/v1/completions", {**OK, "prompt": 17}, 400, "prompt", "valid string"),
    ("/v1/completions", {**OK, "prompt": []}, 400, "prompt", "empty list"),
    ("/v1/completions", {**OK, "prompt": [[1, 2, 3]]}, 400, "prompt", "valid string"),
    ("/v1/completions", {**OK, "prompt": ""}, 400, None, "prompt is empty"),          # the router's own check
    ("/v1/completions", {**OK, "max_tokens": -5}, 400, "max_tokens", "greater than or equal to 1"),
    ("/v1/completions", {**OK, "max_tokens": "16"}, 400, "max_tokens", "valid integer"),
    ("/v1/completions", {**OK, "max_tokens": 10**6}, 400, "max_tokens", "does not fit"),  # the router's, renamed
    ("/v1/completions", {**OK, "temperature": "hot"}, 400, "temperature", "valid number"),
    ("/v1/completions", {**OK, "temperature": -1}, 400, "temperature", "greater than or equal to 0"),
    ("/v1/completions", {**OK, "top_p": 1.5}, 400, "top_p", "less than or equal to 1"),
    ("/v1/completions", {**OK, "n": 0}, 400, "n", "greater than or equal to 1"),
    ("/v1/completions", {**OK, "n": 65}, 400, "n", "at most 64"),
    ("/v1/completions", {**OK, "seed": 2**64}, 400, "seed", "less than"),
    ("/v1/completions", {**OK, "stream": "yes"}, 400, "stream", "valid boolean"),
    ("/v1/completions", {**OK, "stop": [1]}, 400, "stop", "valid string"),
    ("/v1/completions", {**OK, "logprobs": 5}, 400, "logprobs", "not supported"),
    ("/v1/completions", {**OK, "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ("/v1/completions", {**OK, "echo": True}, 400, "echo", "not supported"),
    ("/v1/completions", {**OK, "chain": "nosuchmodel,stdlib-5m"}, 400, None, "unknown model"),
    ("/v1/completions", {**OK, "window": 99}, 400, None, "window"),
    ("/v1/chat/completions", {"model": TARGET, "messages": []}, 400, "messages", "at least 1 item"),
    ("/v1/chat/completions", {"model": TARGET, "messages": [{"role": "bot", "content": "hi"}]}, 400,
     "messages.0.role", "'user'"),
    ("/v1/chat/completions", {"model": TARGET, "messages": [{"role": "tool", "content": "42"}]}, 400, "messages",
     "cannot start with a tool message"),   # the chat template's own refusal
    ("/v1/chat/completions", {"model": TARGET, "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, 400,
     "tools", "not supported"),
]


def post(url: str, body, headers=AUTH, **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url, content=content, headers={"content-type": "application/json", **headers}, timeout=60,
                      **kwargs)


def assert_error(response: httpx.Response, status: int, param: str | None = None, words: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["param"] == param and words in error["message"], error
    return error


@pytest.mark.parametrize("path,body,status,param,words", BAD, ids=[w for *_, w in BAD])
def test_bad_input_is_refused_in_openais_shape_and_the_gateway_goes_on(cluster, path, body, status, param,
                                                                        words) -> None:
    url = f"http://{cluster.gateway}"
    assert_error(post(url + path, body), status, param, words)
    assert post(url + "/v1/completions", OK).json()["choices"][0]["specrouter"]["generated_tokens"] == 2


def test_a_body_over_the_limit_is_refused_unread(cluster) -> None:
    url = f"http://{cluster.gateway}"
    huge = {**OK, "prompt": "x" * (4 << 20)}
    assert_error(post(url + "/v1/completions", huge), 413, None, "over 4194304 bytes")
    # the same without a declared length (chunked): read only up to the limit
    chunks = (part for part in (b'{"model": "x", "prompt": "', b"x" * (5 << 20), b'"}'))
    assert_error(httpx.post(url + "/v1/completions", content=chunks, headers=AUTH, timeout=60), 413)
    assert post(url + "/v1/completions", OK).status_code == 200


def test_unknown_paths_and_methods_answer_in_the_same_shape(cluster) -> None:
    url = f"http://{cluster.gateway}"
    assert_error(httpx.get(url + "/v1/engines", timeout=30), 404, None, "POST /v1/completions")
    assert_error(httpx.get(url + "/v1/completions", timeout=30), 405, None, "GET is not allowed")


def test_the_routers_token_is_the_api_key(cluster) -> None:
    with openai.OpenAI(base_url=cluster.base_url, api_key="wrong-token", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            client.completions.create(model=TARGET, prompt="x", max_tokens=1)
    assert refused.value.status_code == 401 and "not accepted" in refused.value.message
    assert "Authorization: Bearer" in refused.value.message
    for path in ("/v1/completions", "/v1/models"):   # no token at all (the openai client always sends one)
        response = httpx.request("POST" if "completions" in path else "GET", f"http://{cluster.gateway}{path}",
                                 content=json.dumps(OK), timeout=60)
        assert_error(response, 401, None, "requires a bearer token")


def test_a_full_router_answers_429_and_its_requests_go_on(cluster, openai_client, long_prompt) -> None:
    """MAX_IN_FLIGHT streams hold every place (the router keeps none waiting): one more is refused 429 with a
    Retry-After; the streams still finish, and leaving them releases every place and state."""
    streams = [openai_client.completions.create(model=TARGET, prompt=long_prompt, max_tokens=300, temperature=0,
                                                stream=True, extra_body={"chain": "target"})
               for _ in range(MAX_IN_FLIGHT)]
    try:
        firsts = [next(iter(s)) for s in streams]   # each holds its place: its first tokens came
        with pytest.raises(openai.RateLimitError) as refused:
            openai_client.completions.create(model=TARGET, prompt="x", max_tokens=1)
        assert refused.value.status_code == 429 and refused.value.response.headers["retry-after"] == "1"
        assert refused.value.body["type"] == "rate_limit_error"
        assert all(f.choices[0].specrouter["token_ids"] for f in firsts)
        rest = next(iter(streams[0]))   # the stream goes on after the refusal
        assert rest.choices[0].specrouter["token_ids"]
    finally:
        for s in streams:
            s.close()
    wait_until(lambda: released(cluster), "the router's places and the workers' states released")


def test_past_its_deadline_a_request_answers_504(cluster, long_prompt) -> None:
    with InProcessGateway(router=cluster.router, request_timeout_s=0.2) as hurried:
        body = {**OK, "prompt": long_prompt, "max_tokens": 300, "extra": "ignored"}
        assert_error(post(hurried.url + "/v1/completions", body), 504, None, "did not finish in time")
        streamed = post(hurried.url + "/v1/completions", {**body, "stream": True})
        if streamed.status_code == 200:   # its first tokens came in time: the stream ends with the error instead
            events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
            error = json.loads(events[-1].removeprefix("data: "))["error"]
        else:
            error = assert_error(streamed, 504)
        assert error["type"] == "timeout_error" and "did not finish in time" in error["message"]
        assert post(hurried.url + "/v1/completions", {**OK, "max_tokens": 1}).status_code == 200
    wait_until(lambda: released(cluster), "the router's places and the workers' states released")


def test_without_a_router_requests_and_health_answer_503(unused_port) -> None:
    with InProcessGateway(router=f"127.0.0.1:{unused_port}") as orphan:
        error = assert_error(post(orphan.url + "/v1/completions", OK), 503, None, "cannot serve now")
        assert error["type"] == "service_unavailable_error"
        assert_error(httpx.get(orphan.url + "/health", timeout=30), 503, None, "does not serve")


def test_the_demo_pool_has_no_chat_template_and_chat_says_so(cluster) -> None:
    with InProcessGateway(router=cluster.router, tokenizer_dir=DEMO_POOL / "stdlib-29m") as demo:
        body = {"model": TARGET, "messages": [{"role": "user", "content": "hi"}]}
        error = assert_error(post(demo.url + "/v1/chat/completions", body), 400, "messages", "has no chat template")
        assert error["code"] == "no_chat_template" and "--chat-template" in error["message"]
        assert post(demo.url + "/v1/completions", OK).status_code == 200


@pytest.fixture
def unused_port():
    import socket

    with socket.socket() as s:   # bound, never listening: nothing answers there
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


class StatusRouter(router_pb2_grpc.RouterServiceServicer):
    """A router that ends each generation with the gRPC status its prompt names; a stream first sends a chunk
    when the prompt starts with `late:`."""

    def ListModels(self, request, context):
        return pb.ListModelsResponse(models=[pb.ModelInfo(name="fake", parameters=1, role="target")])

    def Generate(self, request, context):
        context.abort(grpc.StatusCode[request.prompt], f"refused as asked: {request.prompt}")

    def GenerateStream(self, request, context):
        code = request.prompt.removeprefix("late:")
        if code != request.prompt:
            yield pb.GenerateChunk(text="a", token_ids=[1])
        context.abort(grpc.StatusCode[code], f"refused as asked: {code}")


@pytest.fixture(scope="module")
def status_gateway():
    server = grpc.server(futures.ThreadPoolExecutor(4))
    router_pb2_grpc.add_RouterServiceServicer_to_server(StatusRouter(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with InProcessGateway(router=f"127.0.0.1:{port}") as gateway:
        yield gateway
    server.stop(0)


STATUSES = [("INVALID_ARGUMENT", 400, "invalid_request_error"), ("UNAUTHENTICATED", 401, "authentication_error"),
            ("NOT_FOUND", 404, "invalid_request_error"), ("RESOURCE_EXHAUSTED", 429, "rate_limit_error"),
            ("UNAVAILABLE", 503, "service_unavailable_error"), ("DEADLINE_EXCEEDED", 504, "timeout_error"),
            ("INTERNAL", 500, "server_error")]


@pytest.mark.parametrize("code,status,kind", STATUSES, ids=[s[0] for s in STATUSES])
def test_each_router_status_has_its_http_status(status_gateway, code, status, kind) -> None:
    for stream in (False, True):
        body = {"model": "fake", "prompt": code, "stream": stream}
        error = assert_error(post(status_gateway.url + "/v1/completions", body, headers={}), status)
        assert error["type"] == kind and error["code"] == code.lower() and "refused as asked" in error["message"]


def test_a_stream_the_router_fails_midway_ends_with_an_error_event(status_gateway) -> None:
    with openai.OpenAI(base_url=status_gateway.url + "/v1", api_key="none", max_retries=0) as client:
        stream = client.completions.create(model="fake", prompt="late:RESOURCE_EXHAUSTED", stream=True)
        first = next(iter(stream))
        assert first.choices[0].text == "a"
        with pytest.raises(openai.APIError, match="refused as asked: RESOURCE_EXHAUSTED"):
            next(iter(stream))
