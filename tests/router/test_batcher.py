"""The continuous batcher on a tiny pool: when requests join the running batches."""

from __future__ import annotations

import threading

import pytest

from specrouter.router.batcher import Batcher
from specrouter.router.cycle_observers import CycleObserver
from specrouter.router.handles import CancelledError, Failed, Finished
from specrouter.router.requests import GenerationRequest
from specrouter.contract.calls import SamplingParams
from tests.router.cycles import RecordedCycles

CONTEXT = 256


def finish(handle, timeout: float = 60.0) -> Finished:
    while True:
        event = handle.events.get(timeout=timeout)
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Finished):
            return event


class HeldPrefill:
    """The target's next prefill waits, once it has begun (`entered`), until the test lets it go (`release`);
    the prefills after it run at once."""

    def __init__(self, target):
        self.target, self.prefill = target, target.prefill
        self.entered, self.release = threading.Event(), threading.Event()
        target.prefill = self._held

    def _held(self, state_id, rows, predictions=0):
        self.target.prefill = self.prefill
        self.entered.set()
        assert self.release.wait(30), "the test never let the prefill finish"
        return self.prefill(state_id, rows, predictions)

    def restore(self) -> None:
        self.target.prefill = self.prefill


def test_requests_arriving_during_a_prefill_join_before_the_first_cycle(tiny_pool) -> None:
    """Clients that send together arrive a few ms apart; the second must not wait out a cycle of the
    first alone (at batch 4 every wave began with one-row cycles, on a window planned for one row)."""
    held = HeldPrefill(tiny_pool["t"])
    recorded = RecordedCycles()
    batcher = Batcher(tiny_pool, "t", CONTEXT, None, observers=[recorded])
    batcher.start()
    try:
        request = GenerationRequest([5, 9, 3], SamplingParams(), 6, chain=("s", "t"), window=2)
        first = batcher.submit(request)
        assert held.entered.wait(30)
        second = batcher.submit(GenerationRequest([7, 1], SamplingParams(), 6, chain=("s", "t"), window=2))
        held.release.set()
        assert len(finish(first).token_ids) == len(finish(second).token_ids) == 6
    finally:
        held.restore()
        batcher.stop()
    sizes = recorded.sizes()
    assert sizes[0] == 2, f"the first cycle ran {sizes[0]} row(s); batch sizes by cycle: {sizes}"


def test_a_request_cancelled_before_it_is_admitted_still_ends(tiny_pool) -> None:
    """A client that cancels while its request waits in the inbox (the loop busy with a prefill) gets its
    CancelledError like any other; the request beside it finishes."""
    held = HeldPrefill(tiny_pool["t"])
    batcher = Batcher(tiny_pool, "t", CONTEXT, None)
    batcher.start()
    try:
        first = batcher.submit(GenerationRequest([5, 9, 3], SamplingParams(), 6, chain=("t",), window=1))
        assert held.entered.wait(30)
        second = batcher.submit(GenerationRequest([7, 1], SamplingParams(), 6, chain=("t",), window=1))
        second.cancel()
        held.release.set()
        assert len(finish(first).token_ids) == 6
        with pytest.raises(CancelledError):
            finish(second, timeout=30)
    finally:
        held.restore()
        batcher.stop()


def target_only(pool, prompt, new) -> list[int]:
    batcher = Batcher(pool, "t", CONTEXT, None)
    batcher.start()
    try:
        return finish(batcher.submit(GenerationRequest(prompt, SamplingParams(), new, chain=("t",)))).token_ids
    finally:
        batcher.stop()


def test_a_scheduler_or_an_observer_that_fails_costs_no_request(tiny_pool, caplog) -> None:
    """An exception while choosing a chain runs that cycle on the target alone; one in an observer of a cycle
    (measurements, metrics) is logged. Either way the requests finish with the target's tokens, and the loop
    lives on."""
    class FailsEveryOther:
        calls = 0

        def choose(self, batch, chain, window):
            self.calls += 1
            if self.calls % 2:
                raise TypeError("a bug in the scheduler")
            return ("s", "t"), 2

    class Failing(CycleObserver):
        def cycle_measured(self, report, rows):
            raise RuntimeError("a bug in measuring")

        def tokens_handed(self, count):
            raise RuntimeError("a bug in counting")

        def cycle_done(self, batch, report, rows, cycle_ns, chosen):
            raise RuntimeError("a bug in the metrics")

    expected = [target_only(tiny_pool, p, 12) for p in ([5, 9, 3], [7, 1])]
    chooser = FailsEveryOther()
    batcher = Batcher(tiny_pool, "t", CONTEXT, None, chooser=chooser, observers=[Failing()])
    batcher.start()
    try:
        handles = [batcher.submit(GenerationRequest(p, SamplingParams(), 12)) for p in ([5, 9, 3], [7, 1])]
        assert [finish(h).token_ids for h in handles] == expected
    finally:
        batcher.stop()
    assert chooser.calls > 2
    assert any("a bug in the scheduler" in r.getMessage() or "scheduler failed" in r.getMessage() for r in caplog.records)
    messages = [r.getMessage() for r in caplog.records]
    for what in ("measurements", "token count", "cycle's observers"):
        assert any(f"the {what} failed" in m for m in messages), what
    assert not any(engine.state_ids() for engine in tiny_pool.values())


class CallsOf:
    """Counts each engine's calls by kind, passing them on."""

    def __init__(self, pool):
        self.pool, self.calls, self.saved = pool, {}, []
        for name, engine in pool.items():
            for kind in ("prefill", "draft", "verify", "release"):
                method = getattr(engine, kind)
                self.saved.append((engine, kind, method))
                setattr(engine, kind, self._counted(name, kind, method))

    def _counted(self, name, kind, method):
        def call(*args, **kwargs):
            self.calls[name, kind] = self.calls.get((name, kind), 0) + 1
            return method(*args, **kwargs)
        return call

    def of(self, name: str) -> int:
        return sum(n for (model, _), n in self.calls.items() if model == name)

    def restore(self) -> None:
        for engine, kind, _ in self.saved:
            delattr(engine, kind)


def test_a_named_chain_calls_only_its_own_models(tiny_pool) -> None:
    """A request that names `s,t` is never prefilled on `m` nor released there: a model the chain does not
    run would only cost the request a prefill. Under `auto` every model holds the rows (the scheduler may
    call any), and the tokens are the target's either way."""
    prompt = [5, 9, 3, 11, 2]
    expected = target_only(tiny_pool, prompt, 10)
    calls = CallsOf(tiny_pool)
    batcher = Batcher(tiny_pool, "t", CONTEXT, None)
    batcher.start()
    try:
        named = finish(batcher.submit(GenerationRequest(prompt, SamplingParams(), 10, chain=("s", "t"), window=3)))
        after_named = {name: calls.of(name) for name in tiny_pool}
        auto = finish(batcher.submit(GenerationRequest(prompt, SamplingParams(), 10)))
    finally:
        batcher.stop()
        calls.restore()
    assert named.token_ids == auto.token_ids == expected
    assert after_named["m"] == 0, calls.calls
    assert after_named["s"] >= 3 and after_named["t"] >= 3, calls.calls   # prefill, a cycle, release
    assert calls.calls.get(("m", "prefill"), 0) == 1, calls.calls
    assert not any(engine.state_ids() for engine in tiny_pool.values())
