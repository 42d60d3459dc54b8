"""Fuzzing the router's public API, live: any GenerateRequest the message can carry, unary and streamed,
and any bytes as the body of each of its methods.

Properties, for every example:
- the call ends with a status a client can act on (OK, INVALID_ARGUMENT, OUT_OF_RANGE or
  RESOURCE_EXHAUSTED, every refusal with a message), never INTERNAL or UNKNOWN, and never hangs;
- an OK answer is a well-formed one (a finish reason, 1 to max_new_tokens tokens inside the vocabulary);
- a well-formed greedy request in flight while the example runs gives the same token ids as before the
  fuzz, which are the target's own (target-only decoding);
and once the examples are done the router process is alive, the same greedy request still gives the same
ids, and no worker holds a state.
"""

from __future__ import annotations

import contextlib
import time

import grpc
import pytest
from hypothesis import example

from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc
from specrouter.v1 import worker_pb2, worker_pb2_grpc
from tests.fuzz.conftest import (CALL_TIMEOUT_S, COPY, DEFAULT_MAX_NEW_TOKENS, DRAFTER, MAX_NEW_TOKENS, TARGET, VOCAB,
                                 call, check_status, quick_and_long)
from tests.fuzz.strategies import generate_requests, raw_bodies

SERVICE = "/specrouter.v1.RouterService/"
ACCEPTABLE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
              grpc.StatusCode.RESOURCE_EXHAUSTED}
FINISH_REASONS = {"stop", "length"}
REFERENCE = pb.GenerateRequest(prompt="def parse(path):\n", max_new_tokens=40, chain=f"{DRAFTER},{TARGET}", window=3)
STATES_GONE_S = 30.0


def max_tokens(request: pb.GenerateRequest) -> int:
    return request.max_new_tokens if request.HasField("max_new_tokens") else DEFAULT_MAX_NEW_TOKENS


def check_answer(request: pb.GenerateRequest, token_ids: list[int], finish_reason: str) -> None:
    assert finish_reason in FINISH_REASONS
    assert 1 <= len(token_ids) <= max_tokens(request) <= MAX_NEW_TOKENS
    assert all(0 <= t < VOCAB for t in token_ids)


class Live:
    """The router under fuzz: its stub, a raw channel, and the reference request's expected ids."""

    def __init__(self, router, channel: grpc.Channel):
        self.router, self.channel = router, channel
        self.stub = router_pb2_grpc.RouterServiceStub(channel)
        self.expected = list(self.stub.Generate(REFERENCE, timeout=CALL_TIMEOUT_S).token_ids)
        target_only = pb.GenerateRequest(prompt=REFERENCE.prompt, max_new_tokens=REFERENCE.max_new_tokens, chain="target")
        assert self.expected == list(self.stub.Generate(target_only, timeout=CALL_TIMEOUT_S).token_ids)
        assert len(self.expected) == REFERENCE.max_new_tokens

    @contextlib.contextmanager
    def reference_in_flight(self):
        """The reference request streams while the body runs (its first tokens are out before the body
        starts); afterwards its ids must be the expected ones."""
        stream = self.stub.GenerateStream(REFERENCE, timeout=CALL_TIMEOUT_S)
        got = list(next(stream).token_ids)
        yield
        for chunk in stream:
            got += chunk.token_ids
        assert got == self.expected, "a well-formed greedy request's output changed while the fuzz ran"

    def raw(self, method: str, streaming: bool = False):
        make = self.channel.unary_stream if streaming else self.channel.unary_unary
        return make(SERVICE + method, request_serializer=lambda b: b, response_deserializer=lambda b: b)

    def live_states(self) -> dict[str, int]:
        out = {}
        for m in self.stub.ListModels(pb.ListModelsRequest(), timeout=CALL_TIMEOUT_S).models:
            with grpc.insecure_channel(m.address) as ch:
                out[m.name] = worker_pb2_grpc.WorkerServiceStub(ch).Info(worker_pb2.InfoRequest()).live_states
        return out

    def check_still_serving(self) -> None:
        assert self.router.alive(), f"the router exited: {self.router.log_tail()}"
        assert list(self.stub.Generate(REFERENCE, timeout=CALL_TIMEOUT_S).token_ids) == self.expected
        deadline = time.monotonic() + STATES_GONE_S
        while any((states := self.live_states()).values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(states.values()), f"states left on the workers after the fuzz: {states}"


@pytest.fixture(scope="module")
def reference(router, router_channel) -> Live:
    return Live(router, router_channel)


@pytest.fixture
def live(reference):
    """The router, checked after each test's examples."""
    yield reference
    reference.check_still_serving()


def call_generate(live: Live, request: pb.GenerateRequest, streaming: bool) -> None:
    method = (lambda r, timeout: list(live.stub.GenerateStream(r, timeout=timeout))) if streaming \
        else (lambda r, timeout: [live.stub.Generate(r, timeout=timeout)])
    with live.reference_in_flight():
        code, details, chunks = call(method, request)
    check_status("GenerateStream" if streaming else "Generate", code, details, ACCEPTABLE)
    if code == grpc.StatusCode.OK:
        assert chunks and not any(c.finish_reason for c in chunks[:-1])
        check_answer(request, [t for c in chunks for t in c.token_ids], chunks[-1].finish_reason)


def fuzz_generate(live: Live, request: pb.GenerateRequest) -> None:
    call_generate(live, request, streaming=False)


def fuzz_stream(live: Live, request: pb.GenerateRequest) -> None:
    call_generate(live, request, streaming=True)


METHODS = [("Generate", False), ("GenerateStream", True), ("ListModels", False), ("Schedule", False)]


def fuzz_raw(live: Live, body: bytes) -> None:
    with live.reference_in_flight():
        for method, streaming in METHODS:
            raw = live.raw(method, streaming)
            code, details, _ = call((lambda b, timeout: list(raw(b, timeout=timeout))) if streaming else raw, body)
            check_status(f"{method} with body {body[:64]!r}", code, details, ACCEPTABLE)


THREE_LEVELS = f"{DRAFTER},{COPY},{TARGET}"

test_generate_requests, test_generate_requests_long = quick_and_long(
    fuzz_generate,
    example(request=pb.GenerateRequest(prompt="def f(x):", temperature=float("nan"))),
    example(request=pb.GenerateRequest(prompt="def f(x):", temperature=float("inf"), seed=1)),
    example(request=pb.GenerateRequest(prompt="def f(x):", temperature=1e-45, seed=1)),   # logits / T overflow
    example(request=pb.GenerateRequest(prompt="def f(x):", repetition_penalty=1e-45)),
    # to the context's last position (1,000 prompt tokens and 23 new), the widest window, three levels
    example(request=pb.GenerateRequest(prompt="x = 1\n" * 250, max_new_tokens=23, chain=THREE_LEVELS, window=16)),
    example(request=pb.GenerateRequest(prompt="x = 1\n" * 250, max_new_tokens=23, chain=THREE_LEVELS, window=16,
                                       temperature=1.0, seed=5)),
    example(request=pb.GenerateRequest(prompt="def f(x):", chain=THREE_LEVELS, window=16, temperature=0.9, seed=3)),
    request=generate_requests)

test_streamed_requests, test_streamed_requests_long = quick_and_long(fuzz_stream, request=generate_requests)

test_raw_bytes, test_raw_bytes_long = quick_and_long(
    fuzz_raw,
    example(body=b"\x0a\x04\xff\xfe\x80\x81"),   # a prompt that is not UTF-8
    example(body=b"\x08"),                        # a field's tag without its value: INTERNAL from ListModels before
    example(body=b"\x00"),                        # field number 0, which no message has
    body=raw_bodies)
