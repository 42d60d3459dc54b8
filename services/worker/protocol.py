"""Protobuf at the edge: conversions between `specrouter.v1.worker_pb2` messages and the call types of `calls.py`.

Both sides use these: the worker server decodes requests and encodes responses, the router's remote
worker does the reverse.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import grpc
import torch

from specrouter.v1 import worker_pb2 as pb
from specrouter.worker import rows as wire
from specrouter.worker.calls import (ContextLengthError, ForwardTiming, RowStep, SamplingParams, StateError, StepResult,
                                     UnknownStateError, VerifyRow)


def sampling_to_pb(s: SamplingParams) -> pb.Sampling:
    return pb.Sampling(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                       repetition_penalty=s.repetition_penalty, seed=s.seed, coupled=s.coupled)


def sampling_from_pb(m: pb.Sampling) -> SamplingParams:
    params = SamplingParams(temperature=m.temperature, top_k=m.top_k, top_p=m.top_p,
                            repetition_penalty=m.repetition_penalty, seed=m.seed, coupled=m.coupled)
    params.validate()
    return params


def step_to_pb(s: RowStep) -> pb.RowStep:
    return pb.RowStep(row_id=s.row_id, rollback=s.rollback, pending_tokens=list(s.pending),
                      sampling=sampling_to_pb(s.sampling), cycle=s.cycle)


def step_from_pb(m: pb.RowStep) -> RowStep:
    return RowStep(row_id=m.row_id, pending=list(m.pending_tokens), sampling=sampling_from_pb(m.sampling),
                   cycle=m.cycle, rollback=m.rollback)


def rows_to_pb(rows: torch.Tensor | None) -> list[pb.DistributionRow]:
    if rows is None:
        return []
    out = []
    for row in rows:
        w = wire.encode_row(row)
        out.append(pb.DistributionRow(values_fp16=w.values, indices_int32=w.indices or b""))
    return out


def rows_from_pb(rows: Sequence[pb.DistributionRow], vocab: int, device: torch.device) -> torch.Tensor | None:
    """fp16 rows [len, vocab], or None for a greedy proposal."""
    if not rows:
        return None
    decoded = [wire.decode_row(wire.WireRow(r.values_fp16, r.indices_int32 or None), vocab) for r in rows]
    return torch.stack(decoded).to(device)


def verify_row_to_pb(v: VerifyRow) -> pb.VerifyRow:
    proposal = pb.Proposal(row_id=v.row_id, tokens=list(v.proposal), rows=rows_to_pb(v.proposal_rows))
    return pb.VerifyRow(step=step_to_pb(v), proposal=proposal)


def verify_row_from_pb(m: pb.VerifyRow, vocab: int, device: torch.device) -> VerifyRow:
    s = step_from_pb(m.step)
    rows = rows_from_pb(m.proposal.rows, vocab, device)
    if rows is not None and rows.shape[0] != len(m.proposal.tokens):
        raise ValueError(f"row {s.row_id!r}: {rows.shape[0]} distribution rows for {len(m.proposal.tokens)} tokens")
    return VerifyRow(row_id=s.row_id, pending=s.pending, sampling=s.sampling, cycle=s.cycle, rollback=s.rollback,
                     proposal=list(m.proposal.tokens), proposal_rows=rows)


def timing_to_pb(timings: Sequence[ForwardTiming], handler_ns: int) -> pb.Timing:
    return pb.Timing(forwards=[pb.ForwardTiming(forward_ns=t.forward_ns, batch_size=t.batch_size,
                                                tokens_per_row=t.tokens_per_row, tokens_valid=t.tokens_valid)
                               for t in timings], handler_ns=handler_ns)


def timings_from_pb(m: pb.Timing) -> list[ForwardTiming]:
    return [ForwardTiming(t.forward_ns, t.batch_size, t.tokens_per_row, t.tokens_valid) for t in m.forwards]


def step_result_to_pb(result: StepResult, row_ids: Sequence[str], handler_ns: int) -> pb.StepResponse:
    accepted = result.accepted or [0] * len(row_ids)
    similarity = result.similarity or [0.0] * len(row_ids)
    proposals = [pb.Proposal(row_id=r, tokens=t, rows=rows_to_pb(q), accepted=a, similarity=sim)
                 for r, t, q, a, sim in zip(row_ids, result.tokens, result.rows, accepted, similarity)]
    return pb.StepResponse(proposals=proposals, timing=timing_to_pb(result.timings, handler_ns))


def step_result_from_pb(m: pb.StepResponse, vocab: int, verify: bool) -> StepResult:
    cpu = torch.device("cpu")
    return StepResult(
        tokens=[list(p.tokens) for p in m.proposals],
        rows=[rows_from_pb(p.rows, vocab, cpu) for p in m.proposals],
        accepted=[p.accepted for p in m.proposals] if verify else [],
        similarity=[p.similarity for p in m.proposals] if verify else [],
        timings=timings_from_pb(m.timing),
        handler_ns=m.timing.handler_ns,
    )


# A call that fails for some of its rows alone (the engine's RowError) names them in its trailing metadata,
# so that the router ends those requests and goes on with the others.
FAILED_ROWS_KEY = "specrouter-failed-rows-bin"


def failed_rows_to_metadata(row_ids: Sequence[str]) -> tuple[tuple[str, bytes], ...]:
    return ((FAILED_ROWS_KEY, json.dumps(list(row_ids)).encode()),)


def failed_rows_from_metadata(metadata) -> tuple[str, ...]:
    """The rows a failed call names; none when it failed as a whole."""
    for key, value in metadata or ():
        if key == FAILED_ROWS_KEY:
            try:
                rows = json.loads(value)
            except ValueError:
                return ()
            return tuple(r for r in rows if isinstance(r, str)) if isinstance(rows, list) else ()
    return ()


CPU_ALLOCATION_FAILED = "DefaultCPUAllocator: can't allocate memory"


def out_of_memory(exc: Exception) -> bool:
    """Whether `exc` is the device running out of memory: Python's MemoryError, torch's OutOfMemoryError
    (CUDA), or the RuntimeError torch's CPU allocator raises when the system refuses an allocation."""
    return (isinstance(exc, (MemoryError, torch.OutOfMemoryError))
            or (isinstance(exc, RuntimeError) and CPU_ALLOCATION_FAILED in str(exc)))


def status_for(exc: Exception) -> grpc.StatusCode:
    """The one place where a call's errors become gRPC status codes: the worker's server answers with it, and
    the router reads an engine's error in process with it as it would the status over the wire."""
    if out_of_memory(exc):   # the router makes the batch smaller
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, UnknownStateError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, ContextLengthError):
        return grpc.StatusCode.OUT_OF_RANGE
    if isinstance(exc, StateError):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL
