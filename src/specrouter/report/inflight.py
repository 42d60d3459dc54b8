"""Requests kept in flight: the way both reports load a router at a batch size."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_flight(call: Callable[[int], T], count: int, batch: int) -> tuple[list[T], float]:
    """`call(i)` for i in 0..count-1 with `batch` calls in flight at a time (a thread each, each taking the
    next index as its call returns, so the router sees a steady batch); the results in index order and
    the wall seconds of the whole."""
    index, lock = iter(range(count)), threading.Lock()
    results: list = [None] * count

    def worker() -> None:
        while True:
            with lock:
                i = next(index, None)
            if i is None:
                return
            results[i] = call(i)

    started = time.perf_counter()
    with ThreadPoolExecutor(batch) as pool:
        for f in [pool.submit(worker) for _ in range(batch)]:
            f.result()
    return results, time.perf_counter() - started
