"""The types both sides of a worker call use: the router builds the steps, the worker returns the results.

A call names a state by id and carries one step per row. `RowStep` is a row's draft step, `VerifyRow`
adds the proposal to check; `StepResult` is what any operation returns. The worker's engine takes and
returns these in process; `protocol.py` turns them into protobuf and back for the gRPC call. They are
plain dataclasses, so the router needs nothing else of the worker.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

GREEDY_TEMPERATURE = 0.0
# Logits are divided by the temperature and by the repetition penalty in fp32: below these the quotients can
# overflow to infinities, and the rows become NaN (vLLM raises temperatures below 0.01 to 0.01 for this reason).
MIN_TEMPERATURE = 1e-2
MIN_REPETITION_PENALTY = 1e-2

__all__ = ["GREEDY_TEMPERATURE", "ContextLengthError", "ForwardTiming", "RowError", "RowStateError", "RowStep",
           "SamplingParams", "StateError", "StepResult", "UnknownStateError", "VerifyRow"]


@dataclass(frozen=True)
class ForwardTiming:
    """What one forward pass cost, as the worker timed it (the profiler's latency samples)."""

    forward_ns: int
    batch_size: int
    tokens_per_row: int   # columns in the block (the longest row)
    tokens_valid: int     # tokens actually processed


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = GREEDY_TEMPERATURE  # 0 means greedy
    top_k: int = 0                           # 0 means off
    top_p: float = 1.0                       # 1 means off
    repetition_penalty: float = 1.0          # 1 means off
    seed: int = 0
    # coupled sampling (sampling.py): a token is argmax(log p + Gumbel noise of (seed, position)) at every
    # level, and a level accepts a proposed token iff its own pick equals it; the text then depends on the
    # prompt, the seed and the target alone. Off: speculative sampling with the rows each token came from.
    coupled: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == GREEDY_TEMPERATURE

    def validate(self) -> None:
        if not (self.greedy or MIN_TEMPERATURE <= self.temperature < math.inf):
            raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got "
                             f"{self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty < math.inf:
            raise ValueError(f"repetition_penalty must be a finite number >= {MIN_REPETITION_PENALTY} (1 turns it "
                             f"off), got {self.repetition_penalty}")


@dataclass(frozen=True)
class RowStep:
    row_id: str
    pending: Sequence[int]   # tokens this model has not processed yet (>= 1)
    sampling: SamplingParams
    cycle: int               # the row's cycle counter: with the seed, it names the row's random stream
    rollback: int = 0        # valid entries to drop before the step


@dataclass(frozen=True)
class VerifyRow(RowStep):
    proposal: Sequence[int] = ()
    proposal_rows: torch.Tensor | None = None  # [k, vocab] fp16 wire rows the proposal was drawn from; None: greedy


@dataclass
class StepResult:
    tokens: list[list[int]]                  # per row: the draft, or the verified proposal (accepted + 1)
    rows: list[torch.Tensor | None]          # per row: [len, vocab] fp16 wire rows handed upward, or None
    accepted: list[int] = field(default_factory=list)  # verify only: accepted proposal tokens per row
    similarity: list[float] = field(default_factory=list)  # verify only, per row: sum over the proposal of 1 - TV(p, q)
    timings: list[ForwardTiming] = field(default_factory=list)
    handler_ns: int = 0   # the worker's handler around the engine call (decode, engine, encode); 0 in process

    @property
    def forward_ns(self) -> int:
        return sum(t.forward_ns for t in self.timings)


# -- the errors a call can end with (protocol.status_for maps them to gRPC status codes) ----------------


class StateError(ValueError):
    """A state operation that the state cannot honour (too long a rollback, unknown rows, ...)."""


class UnknownStateError(KeyError):
    """No state with this id (never created, released, or reclaimed after its TTL)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown state"


class RowError(ValueError):
    """A call that cannot be honoured for some of its rows (`row_ids`), for reasons of those rows alone. It
    is raised before the call changes anything, so the same call without those rows can go ahead."""

    def __init__(self, message: str, row_ids: Sequence[str]):
        super().__init__(message)
        self.row_ids = tuple(row_ids)


class RowStateError(RowError, StateError):
    """Rows whose state cannot honour the call: not in the state, too long a rollback, no pending token."""


class ContextLengthError(RowStateError):
    """Rows would grow past the model's context length."""
