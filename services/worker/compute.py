"""The worker's compute thread: every engine operation runs on the one thread that calls `run`.

gRPC hands each request to a thread of its pool. PyTorch's CPU kernels parallelise through OpenMP, and
a thread team belongs to the thread that starts a parallel region: forward passes started from the
pool's threads build and keep teams of their own beside the main thread's, and on a machine with
few cores those teams contend with each other: the same decode step can cost up to twice as much on a
handler thread as on the main thread. So handlers decode a request, hand
the engine call to this loop on the process's main thread and wait for it, then encode the reply.
The engine serialises its operations anyway, so nothing runs later than it would have.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.1  # how often an idle loop looks at its stop event


class ComputeLoop:
    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()   # a job is queued only while a loop will take it

    def call(self, fn: Callable[[], T]) -> T:
        """Runs `fn` on the compute thread and returns its result (or raises its exception). Called on the
        compute thread itself, or before any thread runs the loop, `fn` runs inline."""
        with self._lock:
            inline = self._thread is None or self._thread is threading.current_thread()
            if not inline:
                future: Future = Future()
                self._jobs.put((fn, future))
        return fn() if inline else future.result()

    def run(self, until: threading.Event) -> None:
        """Runs jobs on the calling thread until `until` is set; later calls run inline."""
        with self._lock:
            self._thread = threading.current_thread()
        try:
            while not until.is_set():
                try:
                    fn, future = self._jobs.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                self._run_one(fn, future)
        finally:
            with self._lock:
                self._thread = None
            self._drain()

    def _drain(self) -> None:
        """Jobs that arrived as the loop stopped run here, on the thread that ran the loop."""
        while True:
            try:
                fn, future = self._jobs.get_nowait()
            except queue.Empty:
                return
            self._run_one(fn, future)

    @staticmethod
    def _run_one(fn: Callable[[], object], future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting handler, which maps it to a status
            future.set_exception(exc)
