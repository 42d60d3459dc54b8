"""The pool's models in the router's own process (`--models-in-process`): one engine per model, built and
warmed up as a worker builds and warms up its model, that the batcher calls directly (the `Worker`
interface) instead of over gRPC.

Why: on one host whose models share its cores (or its device), separate worker processes buy no
parallelism, since a lock-step chain runs one level at a time, and every level of every cycle pays for
an RPC: encoding, the loopback transport and the handler, about 3 ms a call on two cores against a 1m
drafter's 3 ms draft and a 29m target's 11 ms verification. In the router's process a cycle pays none of it, and
the levels share one OpenMP thread team instead of contending with each other's. Separate workers stay
the way to give each model its own machine or device, to scale levels apart, and to survive a model's
crash without the router.

Every engine call runs on the thread that loaded and warmed the models (the process's main thread,
through a `ComputeLoop`, as in a worker): a second thread computing beside the one that built OpenMP's
thread team gets a team of its own, and with two teams alive on a machine with few cores every
operation costs two to three times as much (a 29m decode step: 8.5 ms on the main thread, 17 ms on the
batcher's thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specrouter.contract import wire
from specrouter.contract.calls import RowStep, StepResult, VerifyRow
from specrouter.pool.load import PoolDir
from specrouter.worker.compute import ComputeLoop  # noqa: F401 - the router runs it too
from specrouter.worker.engine import WorkerEngine
from specrouter.worker.server import build_engine, warm_up
from specrouter.worker.settings import WorkerSettings


def load_pool_engines(pool_dir: Path, dtype: str = "float32", device: str = "cpu",
                      say: Callable[[str], None] = lambda _line: None) -> dict[str, WorkerEngine]:
    """Every model of the pool as an engine, keyed by its name in the pool: loaded with the worker's
    defaults (prepacked projections on the CPU), warmed up over the worker's profile grid, its `info`
    carrying the tokenizer's fingerprint and the warm-up latencies (the scheduler's prior), as a worker's
    Info call would."""
    pool = PoolDir.open(pool_dir)
    engines = {}
    for name in pool.names:
        settings = WorkerSettings(model_dir=pool.model_dir(name), name=name, dtype=dtype, device=device)
        engine, info = build_engine(settings)
        warm_up(engine, info, settings.profile_batch_sizes, settings.profile_tokens_per_row)
        engine.info = wire.info_from_pb(info)
        engines[name] = engine
        say(f"model {name} loaded in process ({info.parameters:,} parameters, {info.device}, {info.dtype})")
    return engines


class EngineOnComputeThread:
    """A `WorkerEngine` as the router's batcher calls it (the `Worker` interface), each operation run on
    the compute loop's thread."""

    remote = False   # its calls run in the router's process, one after another

    def __init__(self, engine: WorkerEngine, compute: ComputeLoop):
        self.engine, self.compute = engine, compute
        self.name, self.address, self.info = engine.name, engine.address, engine.info

    def prefill(self, state_id: str, rows: Sequence[tuple[str, Sequence[int]]], predictions: int = 0) -> StepResult:
        return self._timed(lambda: self.engine.prefill(state_id, rows, predictions))

    def draft(self, state_id: str, level: int, window: int, rows: Sequence[RowStep], hand_up: bool = True,
              ) -> StepResult:
        return self._timed(lambda: self.engine.draft(state_id, level, window, rows, hand_up))

    def verify(self, state_id: str, level: int, rows: Sequence[VerifyRow], hand_up: bool) -> StepResult:
        return self._timed(lambda: self.engine.verify(state_id, level, rows, hand_up))

    def _timed(self, step: Callable[[], StepResult]) -> StepResult:
        """The step on the compute thread, its time there as the result's `handler_ns` (what a worker's
        handler reports), so that a request's breakdown tells the engine's time from the hand-off's."""
        def run() -> StepResult:
            started = time.perf_counter_ns()
            result = step()
            result.handler_ns = time.perf_counter_ns() - started
            return result
        return self.compute.call(run)

    def release(self, state_id: str, row_ids: Sequence[str] | None = None) -> None:
        self.compute.call(lambda: self.engine.release(state_id, row_ids))

    def probe(self, timeout_s: float = 2.0) -> None:
        """In the router's own process: always there."""

    def close(self) -> None:
        """Nothing to let go of: the engines go with the process."""


def pool_workers(pool_dir: Path, compute: ComputeLoop, dtype: str = "float32", device: str = "cpu",
                 say: Callable[[str], None] = lambda _line: None) -> dict[str, EngineOnComputeThread]:
    """`load_pool_engines` on this thread, each engine then called through `compute`, which this thread
    must run (`compute.run`) once the router starts."""
    return {name: EngineOnComputeThread(engine, compute)
            for name, engine in load_pool_engines(pool_dir, dtype, device, say).items()}
