"""Which replicas of the pool's models answer. A replica whose call failed is down: new batches are not
placed on it (placement.py), and a batch that held a drafter's or intermediate verifier's replica drops
that model, until a probe finds the replica serving again. A model other than the target sits out while
none of its replicas is up; the target has no stand-in, so it never sits out: its failures fail the
requests once no replica of it is left to take them.

Every model but the target only speeds generation up: with one of them down the pool still serves, on
the chains that remain (the target alone at least), and the output is the same token for token.
"""

from __future__ import annotations

import logging
import threading

from specrouter.router.replicas import ReplicaSet, error_line
from specrouter.router.workers import Worker

log = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """A request named a chain through a model that is down, or no replica of the target is left
    (UNAVAILABLE: retry, or ask for `auto`)."""


class WorkerHealth:
    def __init__(self, replicas: ReplicaSet, target: str, probe_s: float = 1.0):
        self.replicas = replicas
        self.target = target
        self.probe_s = probe_s
        self._down: dict[int, tuple[Worker, str]] = {}   # id(replica) -> (replica, why it was taken out)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def down(self) -> dict[str, str]:
        """The models that sit out (none of their replicas is up), and why; never the target."""
        with self._lock:
            down = dict(self._down)
        out = {}
        for model in self.replicas.models:
            replicas = self.replicas.of(model)
            if model == self.target or any(id(w) not in down for w in replicas):
                continue
            out[model] = down[id(replicas[-1])][1] if replicas else "no replica of it is left"
        return out

    def why(self, worker: Worker) -> str:
        """Why the replica `worker` is out ("up" when it is not)."""
        with self._lock:
            entry = self._down.get(id(worker))
        return entry[1] if entry is not None else "up"

    def is_up(self, worker: Worker) -> bool:
        with self._lock:
            return id(worker) not in self._down

    def mark_down(self, worker: Worker, model: str, why: object) -> None:
        """Takes the replica `worker` of `model` out of new batches until a probe finds it serving."""
        text = error_line(why)
        with self._lock:
            if id(worker) in self._down:
                return
            self._down[id(worker)] = (worker, text)
        log.warning("the replica of %s at %s is out until it answers again: %s", model,
                    self.replicas.address_of(worker), text)

    def probe_once(self) -> None:
        """Asks each replica that is down whether it serves again (`probe()`, the worker's Info); an
        in-process worker, which has no probe, is back at the first round. A replica that left the set
        (its address no longer resolves) is forgotten."""
        members = {id(w) for _, w in self.replicas.members()}
        with self._lock:
            for key in [k for k in self._down if k not in members]:
                del self._down[key]
            down = [w for w, _ in self._down.values()]
        for worker in down:
            try:
                worker.probe()
            except Exception as exc:  # noqa: BLE001 - still down: any failure of the probe says so
                log.debug("the replica of %s is still down: %s", worker.name, exc)
                continue
            with self._lock:
                self._down.pop(id(worker), None)
            log.warning("the replica of %s at %s is back in the pool", worker.name, self.replicas.address_of(worker))

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="worker-health", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(self.probe_s):
            try:
                self.probe_once()
            except Exception:  # noqa: BLE001 - probing must go on
                log.exception("probing the workers failed")
