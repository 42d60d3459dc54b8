"""Admission control on the router's public API: per-request limits (INVALID_ARGUMENT, naming the limit, its
value and how to raise it), a bound on requests generating and a bounded line of waiting ones
(RESOURCE_EXHAUSTED beyond it), with the admitted requests' output unchanged and the server serving on."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from pydantic import ValidationError

from specrouter.client import Client, OverloadedError, SpecRouterError
from specrouter.launcher import ServiceProcess
from specrouter.router.admission import Admission, Overloaded
from specrouter.router.server import Router, connect_workers, create_server
from specrouter.router.settings import RouterSettings
from tests.conftest import DEMO_POOL

WAIT_S = 60.0   # bound on waiting for a thread or a count to get where the test needs it (not a timing assertion)
DRAFTER, TARGET = "stdlib-1m", "stdlib-5m"
PROMPT = "def parse(path):"
LONG = 400   # tokens of the requests that hold the places while the others arrive (seconds of the target's work)
SHORT = 32


def eventually(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


# -- the admission itself ---------------------------------------------------------------------------

class Waiter(threading.Thread):
    """A request that asks `admission` for a place from its own thread and holds it until told."""

    def __init__(self, admission: Admission, wanted=lambda: True):
        super().__init__(daemon=True)
        self.admission, self.wanted = admission, wanted
        self.place, self.got, self.done = None, threading.Event(), threading.Event()

    def run(self) -> None:
        self.place = self.admission.enter(self.wanted)
        self.got.set()
        if self.place is not None:
            self.done.wait(WAIT_S)
            self.place.release()


def test_places_then_a_bounded_line_then_refusal() -> None:
    admission = Admission(max_in_flight=2, max_queued=1)
    first, second = admission.enter(), admission.enter()
    waiting = Waiter(admission)
    waiting.start()
    eventually(lambda: admission.counts() == (2, 1), "the third request never waited in line")
    with pytest.raises(Overloaded) as refused:
        admission.enter()
    message = str(refused.value)
    assert "2 requests generating (max_in_flight) and 1 waiting (max_queued)" in message
    assert "--max-in-flight or SPECROUTER_ROUTER_MAX_IN_FLIGHT" in message
    assert "--max-queued or SPECROUTER_ROUTER_MAX_QUEUED" in message
    first.release()
    first.release()   # a place is given up once, however often it is released
    assert waiting.got.wait(WAIT_S) and waiting.place is not None and admission.counts() == (2, 0)
    waiting.done.set()
    waiting.join(WAIT_S)
    second.release()
    assert admission.counts() == (0, 0)


def test_the_line_is_first_come_first_served() -> None:
    admission = Admission(max_in_flight=1, max_queued=3)
    held = admission.enter()
    line = []
    for k in range(3):
        line.append(Waiter(admission))
        line[-1].start()
        eventually(lambda: admission.counts()[1] == k + 1, f"waiter {k} never joined the line")
    held.release()
    for k, waiter in enumerate(line):
        assert waiter.got.wait(WAIT_S) and not any(w.got.is_set() for w in line[k + 1:])
        waiter.done.set()
        waiter.join(WAIT_S)
    assert admission.counts() == (0, 0)


def test_a_request_whose_client_left_leaves_the_line() -> None:
    admission = Admission(max_in_flight=1, max_queued=1)
    held = admission.enter()
    gone = threading.Event()
    leaving = Waiter(admission, wanted=lambda: not gone.is_set())
    leaving.start()
    eventually(lambda: admission.counts() == (1, 1), "the request never waited")
    gone.set()
    assert leaving.got.wait(WAIT_S) and leaving.place is None
    assert admission.counts() == (1, 0)   # its place in line is free for the next
    next_one = Waiter(admission)
    next_one.start()
    eventually(lambda: admission.counts() == (1, 1), "the next request could not wait")
    held.release()
    assert next_one.got.wait(WAIT_S) and next_one.place is not None
    next_one.done.set()
    next_one.join(WAIT_S)


def test_settings_that_contradict_each_other_are_refused_at_start() -> None:
    base = dict(workers=["x:1"], tokenizer_dir=DEMO_POOL / TARGET)
    with pytest.raises(ValidationError, match=r"default_max_new_tokens \(64\) is over max_new_tokens \(32\)"):
        RouterSettings(**base, max_new_tokens=32)
    with pytest.raises(ValidationError, match=r"threads \(8\) must exceed max_in_flight \+ max_queued \(10\)"):
        RouterSettings(**base, threads=8, max_in_flight=4, max_queued=6)
    assert RouterSettings(**base, max_in_flight=4, max_queued=6).server_threads() == 4 + 6 + 16


# -- a real router on port 0, the demo pool's drafter and target behind it --------------------------

LIMITS = dict(max_prompt_bytes=2000, max_prompt_tokens=64, max_new_tokens=LONG, max_in_flight=2, max_queued=2)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    logs = tmp_path_factory.mktemp("admission-logs")
    workers = [ServiceProcess("specrouter.worker", "--model-dir", str(DEMO_POOL / n), "--name", n, "--port", "0",
                              log_dir=logs, name=n) for n in (DRAFTER, TARGET)]
    settings = RouterSettings(workers=[w.address for w in workers], tokenizer_dir=DEMO_POOL / TARGET,
                              target=TARGET, port=0, **LIMITS)
    router = Router(settings, connect_workers(settings))
    router.start()
    server, port, _ = create_server(settings, router)
    server.start()
    try:
        yield router, f"127.0.0.1:{port}"
    finally:
        server.stop(0).wait()
        router.close()   # and its channels to the workers
        for w in workers:
            w.stop()


@pytest.fixture(scope="module")
def client(router):
    with Client(router[1], timeout_s=120) as c:
        yield c


def test_a_router_over_workers_on_its_own_cpu_plans_between_their_passes(router) -> None:
    """Its workers answer on this machine and compute on its CPU: a planner thread would run beside their
    passes on the same cores, so the scheduler plans on the cycle's thread instead."""
    assert router[0].scheduler.planner.thread is None


def refusal(client: Client, stream: bool, prompt: str, **params) -> SpecRouterError:
    with pytest.raises(SpecRouterError) as err:
        if stream:
            list(client.generate_stream(prompt, **params))
        else:
            client.generate(prompt, **params)
    return err.value


def numbers_prompt(router: Router, tokens: int) -> str:
    """A prompt of more than `tokens` tokens and under 2,000 bytes."""
    prompt = "".join(f"x{i} = {i * 7}\n" for i in range(60))
    assert len(router.tokenizer(prompt)["input_ids"]) > tokens and len(prompt.encode()) < 2000
    return prompt


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_a_request_over_a_limit_is_refused_by_name(router, client, stream) -> None:
    r, _ = router
    cases = [
        ("é" * 1001, {}, "prompt is 2002 bytes of UTF-8, over this router's limit of 2000 (max_prompt_bytes)",
         "--max-prompt-bytes or SPECROUTER_ROUTER_MAX_PROMPT_BYTES"),
        (numbers_prompt(r, 64), {}, "tokens, over this router's limit of 64 (max_prompt_tokens)",
         "--max-prompt-tokens or SPECROUTER_ROUTER_MAX_PROMPT_TOKENS"),
        (PROMPT, {"max_new_tokens": LONG + 1}, f"max_new_tokens is {LONG + 1}, over this router's limit of {LONG} "
         "(max_new_tokens)", "--max-new-tokens or SPECROUTER_ROUTER_MAX_NEW_TOKENS"),
    ]
    for prompt, params, says, flag in cases:
        err = refusal(client, stream, prompt, **params)
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT and says in err.message and flag in err.message, err
    tokens = len(r.tokenizer(numbers_prompt(r, 64))["input_ids"])
    assert f"prompt has {tokens} tokens" in refusal(client, stream, numbers_prompt(r, 64)).message
    assert client.generate(PROMPT, max_new_tokens=2).token_ids   # still serving
    assert r.admission.counts() == (0, 0)


def test_streams_hold_their_places_while_they_generate(router, client) -> None:
    r, _ = router
    holders = [client.generate_stream(PROMPT, max_new_tokens=LONG, chain="target") for _ in range(2)]
    firsts = [next(h) for h in holders]   # a first chunk says the request is generating
    assert r.admission.counts() == (2, 0)
    held = [[t for c in [first, *rest] for t in c.token_ids] for first, rest in zip(firsts, holders)]
    expected = client.generate(PROMPT, max_new_tokens=LONG, chain="target").token_ids
    assert held == [expected, expected]
    assert r.admission.counts() == (0, 0)


def test_a_burst_past_the_line_is_refused_and_the_admitted_requests_are_exact(router, client) -> None:
    r, address = router
    # the test holds both places itself, so they stay taken however fast the target generates
    places = [r.admission.enter(), r.admission.enter()]
    assert r.admission.counts() == (2, 0)
    # a request whose deadline passes while it waits in line leaves it
    with Client(address, timeout_s=0.5) as hurried:
        assert refusal(hurried, False, PROMPT, max_new_tokens=SHORT).code == grpc.StatusCode.DEADLINE_EXCEEDED
    eventually(lambda: r.admission.counts() == (2, 0), "the request that timed out stayed in line")
    # a burst of five: two find a place in line, three are refused at once (unary calls and streams alike)
    outcomes: list = [None] * 5

    def ask(k: int) -> None:
        try:
            if k % 2:
                outcomes[k] = [t for c in client.generate_stream(PROMPT, max_new_tokens=SHORT) for t in c.token_ids]
            else:
                outcomes[k] = client.generate(PROMPT, max_new_tokens=SHORT).token_ids
        except SpecRouterError as exc:
            outcomes[k] = exc

    burst = [threading.Thread(target=ask, args=(k,)) for k in range(5)]
    for t in burst:
        t.start()
    eventually(lambda: sum(isinstance(o, SpecRouterError) for o in outcomes) == 3
               and r.admission.counts() == (2, 2), "the burst did not leave two in line and three refused")
    refused = [o for o in outcomes if isinstance(o, SpecRouterError)]
    for err in refused:
        assert isinstance(err, OverloadedError) and err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 requests generating (max_in_flight) and 2 waiting (max_queued)" in err.message
    for place in places:   # the places pass to the two in line, first come first served
        place.release()
    for t in burst:
        t.join(WAIT_S)
    # the server answers on, and every admitted request got the target's own output
    expected = client.generate(PROMPT, max_new_tokens=SHORT, chain="target").token_ids
    assert [o for o in outcomes if not isinstance(o, SpecRouterError)] == [expected] * 2
    assert r.admission.counts() == (0, 0)
