"""The worker's compute loop: engine calls from handler threads run on the loop's thread, in order,
and their results and exceptions come back to the caller."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from specrouter.worker.compute import ComputeLoop


def test_calls_from_other_threads_run_on_the_loop_thread_in_order() -> None:
    loop, stop = ComputeLoop(), threading.Event()
    ran_on, order = [], []
    runner = threading.Thread(target=loop.run, args=(stop,))
    runner.start()
    try:
        def job(i: int) -> int:
            return loop.call(lambda: (ran_on.append(threading.current_thread()), order.append(i), i * i)[-1])

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(job, range(64)))
    finally:
        stop.set()
        runner.join(5)
    assert results == [i * i for i in range(64)]
    assert set(ran_on) == {runner}
    assert sorted(order) == list(range(64))


def test_an_exception_reaches_the_caller_and_the_loop_goes_on() -> None:
    loop, stop = ComputeLoop(), threading.Event()
    runner = threading.Thread(target=loop.run, args=(stop,))
    runner.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            with pytest.raises(KeyError, match="no such state"):
                pool.submit(loop.call, lambda: {}["no such state"]).result()
            assert pool.submit(loop.call, lambda: 7).result() == 7
    finally:
        stop.set()
        runner.join(5)
    assert not runner.is_alive()


def test_without_a_running_loop_calls_run_inline() -> None:
    loop = ComputeLoop()
    assert loop.call(lambda: threading.current_thread()) is threading.current_thread()
