"""Fuzzing the router's batch loop in process: random requests join and leave a running batch, with mixed
sampling parameters, stop strings and seeds, while worker calls fail.

The loop is the router's own (`Batcher` over the tiny pool's engines). Each example draws requests (prompt,
sampling, seed, stop strings, a named chain and window, when it arrives, whether its client cancels) and a
schedule of faults: a release that fails once or twice, a model whose states vanish (a restart, or its TTL),
the target going silent for a few calls, a drafter failing a call. Properties:
- every request ends: it finishes, or fails only for a reason of its own (its client cancelled; the chain it
  named lost a model);
- a finished request has exactly the tokens and the finish reason of the same request run alone, with no
  fault (greedy and sampled alike: a row's random streams depend on its seed, cycle and level only);
- no worker holds a state at the end.
"""

from __future__ import annotations

import contextlib
import threading
import time

from hypothesis import strategies as st

from specrouter.router.batcher import Batcher
from specrouter.router.cycle_observers import CycleObserver
from specrouter.router.handles import CancelledError, Failed, Finished
from specrouter.router.health import ModelUnavailable
from specrouter.router.requests import GenerationRequest
from specrouter.contract.calls import SamplingParams
from specrouter.worker.engine import WorkerEngine
from tests.conftest import TINY_VOCAB
from tests.fuzz.conftest import quick_and_long

CONTEXT = 256
CHAINS = [(("t",), 1), (("t",), 3), (("s", "t"), 2), (("s", "t"), 4), (("m", "t"), 3), (("s", "m", "t"), 3)]
WAIT_S = 120.0
PIECES = [chr(ord("a") + i % 26) * (1 + i % 3) for i in range(TINY_VOCAB)]   # token i's text


def decode(ids) -> str:
    return "".join(PIECES[i] for i in ids)


sampling = st.one_of(
    st.just(SamplingParams()),
    st.builds(SamplingParams, repetition_penalty=st.sampled_from([0.5, 1.3])),
    st.builds(SamplingParams, temperature=st.sampled_from([0.7, 1.0, 1.3]), top_k=st.sampled_from([0, 5, 20]),
              top_p=st.sampled_from([1.0, 0.8]), repetition_penalty=st.sampled_from([1.0, 1.2]),
              seed=st.integers(0, 2**63 - 1), coupled=st.booleans()))

request = st.fixed_dictionaries({
    "prompt": st.lists(st.integers(0, TINY_VOCAB - 1), min_size=1, max_size=12),
    "sampling": sampling,
    "max_new": st.integers(1, 20),
    "stop": st.lists(st.text(alphabet="abcdefghij", min_size=1, max_size=3), max_size=2),
    "chain": st.sampled_from(CHAINS),
    "arrives": st.integers(0, 6),                  # the batch's cycle before which it is submitted
    "cancels": st.one_of(st.none(), st.integers(1, 8)),   # cycles after it arrives that its client cancels
})

fault = st.tuples(st.integers(0, 10),              # the batch's cycle after which it strikes
                  st.sampled_from(["release", "release-twice", "wipe", "silent-target", "drafter-fails"]),
                  st.sampled_from(["s", "m", "t"]))


class Faults:
    """Faults put into the engines as instance attributes, and taken out again."""

    def __init__(self, pool):
        self.pool = pool
        self.failed_models: set[str] = set()   # drafters that failed a call: requests naming them may fail

    def strike(self, kind: str, model: str) -> None:
        e = self.pool[model]
        if kind in ("release", "release-twice"):
            self._fail(e, "release", 1 if kind == "release" else 2, RuntimeError("a release lost on its way"))
        elif kind == "wipe":   # the engine's own release, not a fault put in before
            for state in e.state_ids():
                WorkerEngine.release(e, state)
        elif kind == "silent-target":
            self._fail(self.pool["t"], "verify", 2, ConnectionError("the target does not answer"))
            self._fail(self.pool["t"], "draft", 2, ConnectionError("the target does not answer"))
        elif model != "t":
            self.failed_models.add(model)
            self._fail(e, "draft", 1, ConnectionError(f"{model} does not answer"))
            self._fail(e, "verify", 1, ConnectionError(f"{model} does not answer"))

    @staticmethod
    def _fail(engine, method: str, times: int, error: Exception) -> None:
        inner, left = getattr(engine, method), [times]

        def call(*args, **kwargs):
            if left[0] > 0:
                left[0] -= 1
                raise error
            return inner(*args, **kwargs)

        setattr(engine, method, call)

    def clear(self) -> None:
        for e in self.pool.values():
            for method in ("release", "verify", "draft"):
                vars(e).pop(method, None)


@contextlib.contextmanager
def batcher(pool, observer: CycleObserver | None = None):
    b = Batcher(pool, "t", CONTEXT, None, observers=[observer] if observer else [], decode=decode,
                target_wait_s=WAIT_S)
    b.health.probe_s = 0.05
    b.start()
    try:
        yield b
    finally:
        b.stop()


def ending(handle):
    while True:
        event = handle.events.get(timeout=WAIT_S)
        if isinstance(event, (Finished, Failed)):
            return event


def as_request(r) -> GenerationRequest:
    chain, window = r["chain"]
    return GenerationRequest(r["prompt"], r["sampling"], r["max_new"], tuple(r["stop"]), chain, window)


def alone(pool, r) -> Finished:
    with batcher(pool) as b:
        out = ending(b.submit(as_request(r)))
    assert isinstance(out, Finished), out
    return out


def check_batch(tiny_pool, requests, faults) -> None:
    reference = [alone(tiny_pool, r) for r in requests]
    injected = Faults(tiny_pool)
    handles: dict[int, tuple] = {}   # request -> (its handle, the batch's cycle it was submitted at)
    cycles = [0]
    pending = sorted(range(len(requests)), key=lambda i: requests[i]["arrives"])
    schedule = sorted(faults)
    lock = threading.Lock()   # the loop's thread submits arrivals between cycles; this one when none run

    def arrive(b, until: float) -> None:
        while pending and requests[pending[0]]["arrives"] <= until:
            i = pending.pop(0)
            handles[i] = (b.submit(as_request(requests[i])), cycles[0])

    try:
        class Between(CycleObserver):
            """After each cycle, on the loop's thread: the requests due arrive, clients cancel, faults strike."""

            def cycle_done(self, batch, report, rows, cycle_ns, chosen) -> None:
                with lock:
                    cycles[0] += 1
                    arrive(b, cycles[0])
                    for i, (h, since) in handles.items():
                        if requests[i]["cancels"] is not None and cycles[0] - since >= requests[i]["cancels"]:
                            h.cancel()
                    while schedule and schedule[0][0] <= cycles[0]:
                        _, kind, model = schedule.pop(0)
                        injected.strike(kind, model)

        with batcher(tiny_pool, Between()) as b:
            with lock:
                arrive(b, 0)
            outcomes = {}
            while len(outcomes) < len(requests):
                with lock:
                    waiting = [(i, h) for i, (h, _) in handles.items() if i not in outcomes]
                    if not waiting:   # every request submitted has ended before the others arrived
                        arrive(b, float("inf"))
                        continue
                for i, h in waiting:
                    outcomes[i] = ending(h)
    finally:
        injected.clear()
    deadline = time.monotonic() + WAIT_S   # releases that failed are sent again once the worker answers
    while len(b.orphans) and time.monotonic() < deadline:
        b.orphans.retry()
        time.sleep(0.05)
    for i, r in enumerate(requests):
        out = outcomes[i]
        if isinstance(out, Failed):
            named = set(r["chain"][0])
            assert (isinstance(out.error, CancelledError) and r["cancels"] is not None) or (
                isinstance(out.error, ModelUnavailable) and named & injected.failed_models), (i, r, out.error)
            continue
        assert (out.finish_reason, out.token_ids) == (reference[i].finish_reason, reference[i].token_ids), (i, r)
    leftover = {name: e.state_ids() for name, e in tiny_pool.items() if e.state_ids()}
    assert not leftover, f"states left behind: {leftover}"


test_joins_leaves_and_faults_keep_every_row_as_alone, test_joins_leaves_and_faults_long = quick_and_long(
    check_batch,
    requests=st.lists(request, min_size=1, max_size=5),
    faults=st.lists(fault, max_size=4),
)
