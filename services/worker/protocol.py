"""The worker's end of the wire: distribution rows between protobuf and tensors.

Everything else a call carries converts without torch in `specrouter.contract.wire`, which the router
uses too; the rows are the part only a worker decodes (to verify a proposal against them) and encodes
(the rows of its own proposal, handed up).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specrouter.contract.calls import StepResult, VerifyRow
from specrouter.contract.wire import step_from_pb, timing_to_pb
from specrouter.v1 import worker_pb2 as pb
from specrouter.worker import rows as wire


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


def verify_row_from_pb(m: pb.VerifyRow, vocab: int, device: torch.device) -> VerifyRow:
    s = step_from_pb(m.step)
    rows = rows_from_pb(m.proposal.rows, vocab, device)
    if rows is not None and rows.shape[0] != len(m.proposal.tokens):
        raise ValueError(f"row {s.row_id!r}: {rows.shape[0]} distribution rows for {len(m.proposal.tokens)} tokens")
    return VerifyRow(row_id=s.row_id, pending=s.pending, sampling=s.sampling, cycle=s.cycle, rollback=s.rollback,
                     proposal=list(m.proposal.tokens), proposal_rows=rows)


def step_result_to_pb(result: StepResult, row_ids: Sequence[str], handler_ns: int) -> pb.StepResponse:
    accepted = result.accepted or [0] * len(row_ids)
    similarity = result.similarity or [0.0] * len(row_ids)
    proposals = [pb.Proposal(row_id=r, tokens=t, rows=rows_to_pb(q), accepted=a, similarity=sim)
                 for r, t, q, a, sim in zip(row_ids, result.tokens, result.rows, accepted, similarity)]
    return pb.StepResponse(proposals=proposals, timing=timing_to_pb(result.timings, handler_ns))
