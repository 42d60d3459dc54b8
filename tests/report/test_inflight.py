"""Requests kept in flight: every index once, results in order, never more than the batch at a time."""

from __future__ import annotations

import threading
import time

from specrouter.report.inflight import in_flight


def test_every_call_once_in_order_with_the_batch_in_flight() -> None:
    lock, running, most = threading.Lock(), [0], [0]

    def call(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05 + 0.01 * (i % 3))   # uneven calls: a thread takes the next index as soon as it is free
        with lock:
            running[0] -= 1
        return i * 10

    results, seconds = in_flight(call, 11, 4)
    assert results == [i * 10 for i in range(11)]
    assert most[0] == 4 and seconds > 0
