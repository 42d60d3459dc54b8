"""What the router needs of a worker. `WorkerEngine` satisfies it in process; the gRPC client over the wire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specrouter.worker.calls import RowStep, StepResult, VerifyRow


class Worker(Protocol):
    name: str

    def prefill(self, state_id: str, rows: Sequence[tuple[str, Sequence[int]]], predictions: int = 0,
                ) -> StepResult: ...

    def draft(self, state_id: str, level: int, window: int, rows: Sequence[RowStep], hand_up: bool = True,
              ) -> StepResult: ...

    def verify(self, state_id: str, level: int, rows: Sequence[VerifyRow], hand_up: bool) -> StepResult: ...

    def release(self, state_id: str, row_ids: Sequence[str] | None = None) -> None: ...
