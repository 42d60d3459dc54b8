"""What the router needs of a worker: `RemoteWorker` over gRPC, `WorkerEngine` in process, and the
model-free `LookupProposer` all provide it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specrouter.contract.calls import RowStep, StepResult, VerifyRow, WorkerInfo


class Worker(Protocol):
    name: str
    # whether its calls run in another process: calls to several such workers may overlap, and releases to
    # them go out without waiting for their answers
    remote: bool
    # where it answers, as logs and the router's ListModels name it
    address: str
    # the model it serves: its size and context, its tokenizer, its latencies at warm-up
    info: WorkerInfo

    def prefill(self, state_id: str, rows: Sequence[tuple[str, Sequence[int]]], predictions: int = 0,
                ) -> StepResult: ...

    def draft(self, state_id: str, level: int, window: int, rows: Sequence[RowStep], hand_up: bool = True,
              ) -> StepResult: ...

    def verify(self, state_id: str, level: int, rows: Sequence[VerifyRow], hand_up: bool) -> StepResult: ...

    def release(self, state_id: str, row_ids: Sequence[str] | None = None) -> None: ...

    def probe(self, timeout_s: float = 2.0) -> None:
        """Raises unless the worker answers (the health checks' question)."""

    def close(self) -> None:
        """Lets go of what the router holds of the worker (its channel); the worker's states expire there."""


LOOPBACK_HOSTS = ("127.", "localhost", "[::1]", "::1", "unix:")


def computes_on_this_hosts_cpu(worker: Worker) -> bool:
    """Whether a worker's passes run on the cores of the router's own machine: a worker on the CPU in this
    process, or one that answers at a loopback address or a Unix socket."""
    local = not worker.remote or worker.address.startswith(LOOPBACK_HOSTS)
    return local and worker.info.device == "cpu"
