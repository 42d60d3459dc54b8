"""The steps the router sends a worker and what the worker returns.

A call names a state by id and carries one step per row. `RowStep` is a row's draft step, `VerifyRow`
adds the proposal to check; `StepResult` is what any operation returns, `WorkerInfo` what a worker says of
itself. The worker's engine takes and returns these in process; `wire.py` turns them into protobuf and
back for the gRPC call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

GREEDY_TEMPERATURE = 0.0
# Logits are divided by the temperature and by the repetition penalty in fp32: below these the quotients can
# overflow to infinities, and the rows become NaN (vLLM raises temperatures below 0.01 to 0.01 for this reason).
MIN_TEMPERATURE = 1e-2
MIN_REPETITION_PENALTY = 1e-2

__all__ = ["GREEDY_TEMPERATURE", "MIN_REPETITION_PENALTY", "MIN_TEMPERATURE", "DistributionRows", "ForwardTiming",
           "RowStep", "SamplingParams", "StepResult", "VerifyRow", "WorkerInfo"]

# The distribution rows a level hands up for the tokens it proposed ([k, vocab] in fp16, sparse or dense):
# the engine's tensor within one process, the wire's encoded rows (`wire.py`) between processes. The router
# only cuts them to a proposal's length (`len`, slicing) and hands them to the next level as they are.
DistributionRows = Any


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
    proposal_rows: DistributionRows | None = None  # the rows the proposal was drawn from; None: greedy


@dataclass
class StepResult:
    tokens: list[list[int]]                  # per row: the draft, or the verified proposal (accepted + 1)
    rows: list[DistributionRows | None]     # per row: the distribution rows handed upward, or None
    accepted: list[int] = field(default_factory=list)  # verify only: accepted proposal tokens per row
    similarity: list[float] = field(default_factory=list)  # verify only, per row: sum over the proposal of 1 - TV(p, q)
    timings: list[ForwardTiming] = field(default_factory=list)
    handler_ns: int = 0   # the worker's handler around the engine call (decode, engine, encode); 0 in process

    @property
    def forward_ns(self) -> int:
        return sum(t.forward_ns for t in self.timings)


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker says of the model it serves: the router checks that a pool's models share a tokenizer
    and that the replicas of a model agree, reads each model's size and context, and takes the latencies
    measured at warm-up as the scheduler's prior."""

    model_name: str
    parameters: int
    vocab_size: int
    context_length: int
    tokenizer_sha256: str = ""   # empty where unknown (an engine built in this process from a model alone)
    device: str = "cpu"
    dtype: str = "float32"
    warmup_forwards: tuple[ForwardTiming, ...] = ()
