"""The protobuf forms of the contract's types (`specrouter.v1.worker_pb2`), for both ends of a gRPC call.

Distribution rows stay in their wire form here (`pb.DistributionRow`: fp16 values, and the indices of a
sparse row): the router hands a level's rows to the next level as the bytes it received, and only the
worker's `protocol.py` turns them into tensors and back.
"""

from __future__ import annotations

from collections.abc import Sequence

from specrouter.contract.calls import (DistributionRows, ForwardTiming, RowStep, SamplingParams, StepResult,
                                       VerifyRow, WorkerInfo)
from specrouter.v1 import worker_pb2 as pb


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


def wire_rows(rows: DistributionRows | None) -> list[pb.DistributionRow]:
    """Rows received from a worker, to send on as they are; none for a greedy proposal."""
    if rows is None:
        return []
    rows = list(rows)
    if rows and not isinstance(rows[0], pb.DistributionRow):
        raise TypeError(f"distribution rows must be the wire's encoded rows to travel to a worker in another "
                        f"process, got {type(rows[0]).__name__}: a chain cannot mix workers in this process "
                        "and workers in others when it samples")
    return rows


def verify_row_to_pb(v: VerifyRow) -> pb.VerifyRow:
    proposal = pb.Proposal(row_id=v.row_id, tokens=list(v.proposal), rows=wire_rows(v.proposal_rows))
    return pb.VerifyRow(step=step_to_pb(v), proposal=proposal)


def timing_to_pb(timings: Sequence[ForwardTiming], handler_ns: int) -> pb.Timing:
    return pb.Timing(forwards=[pb.ForwardTiming(forward_ns=t.forward_ns, batch_size=t.batch_size,
                                                tokens_per_row=t.tokens_per_row, tokens_valid=t.tokens_valid)
                               for t in timings], handler_ns=handler_ns)


def timings_from_pb(forwards: Sequence[pb.ForwardTiming]) -> list[ForwardTiming]:
    return [ForwardTiming(t.forward_ns, t.batch_size, t.tokens_per_row, t.tokens_valid) for t in forwards]


def step_result_from_pb(m: pb.StepResponse, verify: bool) -> StepResult:
    """A worker's answer with each proposal's rows kept in their wire form."""
    return StepResult(
        tokens=[list(p.tokens) for p in m.proposals],
        rows=[list(p.rows) or None for p in m.proposals],
        accepted=[p.accepted for p in m.proposals] if verify else [],
        similarity=[p.similarity for p in m.proposals] if verify else [],
        timings=timings_from_pb(m.timing.forwards),
        handler_ns=m.timing.handler_ns,
    )


def info_from_pb(m: pb.InfoResponse) -> WorkerInfo:
    return WorkerInfo(model_name=m.model_name, parameters=m.parameters, vocab_size=m.vocab_size,
                      context_length=m.context_length, tokenizer_sha256=m.tokenizer_sha256, device=m.device,
                      dtype=m.dtype, warmup_forwards=tuple(timings_from_pb(m.warmup_forwards)))
