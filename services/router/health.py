"""Which models of the pool answer. A drafter or intermediate verifier whose call failed sits out (the
batches drop it, the scheduler plans without it) until a probe finds its worker serving again; the
target has no stand-in, so its failures fail the requests, as they must.

Every model but the target only speeds generation up: with one of them down the pool still serves, on
the chains that remain (the target alone at least), and the output is the same token for token.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from specrouter.router.workers import Worker

log = logging.getLogger(__name__)


class ModelUnavailable(RuntimeError):
    """A request named a chain through a model that is down (UNAVAILABLE: retry, or ask for `auto`)."""


class WorkerHealth:
    def __init__(self, workers: Mapping[str, Worker], target: str, probe_s: float = 1.0):
        self.workers = dict(workers)
        self.target = target
        self.probe_s = probe_s
        self._down: dict[str, str] = {}   # model -> why it was taken out
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def down(self) -> dict[str, str]:
        """The models sitting out, and why."""
        with self._lock:
            return dict(self._down)

    def mark_down(self, model: str, why: object) -> None:
        """Takes `model` out of new batches until a probe finds it serving; the target stays in."""
        if model == self.target or model not in self.workers:
            return
        with self._lock:
            if model in self._down:
                return
            self._down[model] = str(why).splitlines()[0][:300] if str(why) else type(why).__name__
        log.warning("model %s is out of the pool until its worker answers again: %s", model, self._down[model])

    def probe_once(self) -> None:
        """Asks each model that is down whether its worker serves again (`probe()`, the worker's Info);
        an in-process worker, which has no probe, is back at the first round."""
        for model in list(self.down()):
            probe = getattr(self.workers[model], "probe", None)
            try:
                if probe is not None:
                    probe()
            except Exception as exc:  # noqa: BLE001 - still down: any failure of the probe says so
                log.debug("model %s still down: %s", model, exc)
                continue
            with self._lock:
                self._down.pop(model, None)
            log.warning("model %s is back in the pool", model)

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
