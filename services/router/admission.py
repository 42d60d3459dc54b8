"""How many generation requests the router serves at once, and how many may wait for a place.

A request takes one of `max_in_flight` places for as long as its call lasts. One that finds them all taken
waits in a line of at most `max_queued`, first come first served; beyond it the request is refused at once
(`Overloaded`, RESOURCE_EXHAUSTED), so a burst costs bounded threads and memory and the requests already
admitted go on as if it had not come.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from specrouter.router.settings import setting_hint

WAIT_POLL_S = 0.25   # how often a waiting request checks that its client still wants it


class Overloaded(RuntimeError):
    """Every place is taken and the line is full: retry later (RESOURCE_EXHAUSTED)."""


class Place:
    """A place in flight; `release` gives it up (once, from any thread: the call's end or its handler)."""

    def __init__(self, admission: Admission):
        self._admission = admission
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._admission._leave()


class Admission:
    def __init__(self, max_in_flight: int, max_queued: int):
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self._in_flight = 0
        self._line: deque[threading.Event] = deque()   # the waiting requests' turns, oldest first
        self._lock = threading.Lock()

    def counts(self) -> tuple[int, int]:
        """(requests in flight, requests waiting)."""
        with self._lock:
            return self._in_flight, len(self._line)

    def enter(self, wanted: Callable[[], bool] = lambda: True) -> Place | None:
        """A place in flight, after a wait in line if every place is taken; None if `wanted()` turned false
        while it waited (its client went away). Raises `Overloaded` if the line is full too."""
        with self._lock:
            if self._in_flight < self.max_in_flight and not self._line:
                self._in_flight += 1
                return Place(self)
            if len(self._line) >= self.max_queued:
                raise Overloaded(self._refusal())
            turn = threading.Event()
            self._line.append(turn)
        while not turn.wait(WAIT_POLL_S):
            if not wanted():
                with self._lock:
                    if not turn.is_set():   # still in line: leave it
                        self._line.remove(turn)
                        return None
                self._leave()   # the place was handed over just now: pass it on
                return None
        return Place(self)

    def _leave(self) -> None:
        """A place is given up: the oldest waiting request takes it over, else it is free."""
        with self._lock:
            if self._line:
                self._line.popleft().set()
            else:
                self._in_flight -= 1

    def _refusal(self) -> str:
        raise_hint = (f"raise max_in_flight ({setting_hint('max_in_flight')}) or max_queued "
                      f"({setting_hint('max_queued')})")
        return (f"the router is at its limit: {self.max_in_flight} requests generating (max_in_flight) and "
                f"{self.max_queued} waiting (max_queued); retry later, or have the operator {raise_hint}")
