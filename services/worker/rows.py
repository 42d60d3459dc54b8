"""Distribution rows as they travel from one level of a chain to the next.

A level's proposal carries, for every token, the distribution the token was drawn from. On the wire:
- greedy rows are not sent at all: the row is the point mass on the token itself;
- sampled rows are sent in fp16, dense ([vocab] values) or sparse (indices and values of the non-zero
  entries, what top-k / top-p leave), whichever is smaller.
Reduced precision is exact only because the sender samples from the reduced rows. A row is kept as
its fp16 values (`to_wire`) from the moment it is made; sender and receiver alike turn it into
probabilities with `as_probs`, so both use bit-identical numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WIRE_DTYPE = torch.float16
INDEX_BYTES = 4  # int32 token ids in a sparse row
VALUE_BYTES = 2  # fp16 values


def to_wire(probs: torch.Tensor) -> torch.Tensor:
    """Rows as they travel: fp16 values, not renormalised. [..., vocab] -> [..., vocab]."""
    return probs.to(WIRE_DTYPE)


def as_probs(rows: torch.Tensor) -> torch.Tensor:
    """The distribution a wire row stands for: fp32, renormalised. [..., vocab] -> [..., vocab]."""
    values = rows.float()
    return values / values.sum(-1, keepdim=True)


@dataclass(frozen=True)
class WireRow:
    """One encoded row: dense values, or sparse indices + values."""

    values: bytes
    indices: bytes | None  # None for a dense row

    @property
    def nbytes(self) -> int:
        return len(self.values) + (len(self.indices) if self.indices is not None else 0)


def encode_row(row: torch.Tensor) -> WireRow:
    """Encodes one fp16 row [vocab] made by `to_wire`."""
    half = row.to(WIRE_DTYPE).cpu()
    nonzero = half.nonzero().squeeze(-1)
    if nonzero.numel() * (INDEX_BYTES + VALUE_BYTES) < half.numel() * VALUE_BYTES:
        return WireRow(values=half[nonzero].numpy().tobytes(), indices=nonzero.int().numpy().tobytes())
    return WireRow(values=half.numpy().tobytes(), indices=None)


def decode_row(row: WireRow, vocab: int) -> torch.Tensor:
    """The fp16 row [vocab], bit-identical to the one the sender encoded."""
    if row.indices is None:
        if len(row.values) != vocab * VALUE_BYTES:
            raise ValueError(f"a dense row must hold {vocab} fp16 values ({vocab * VALUE_BYTES} bytes), got "
                             f"{len(row.values)} bytes")
        return torch.frombuffer(bytearray(row.values), dtype=WIRE_DTYPE).clone()
    count = len(row.indices) // INDEX_BYTES
    if len(row.indices) % INDEX_BYTES or len(row.values) != count * VALUE_BYTES:
        raise ValueError(f"a sparse row needs one int32 index ({INDEX_BYTES} bytes) per fp16 value ({VALUE_BYTES} "
                         f"bytes), got {len(row.indices)} bytes of indices and {len(row.values)} of values")
    values = torch.frombuffer(bytearray(row.values), dtype=WIRE_DTYPE)
    idx = torch.frombuffer(bytearray(row.indices), dtype=torch.int32).long()
    if bool((idx < 0).any()) or bool((idx >= vocab).any()):
        raise ValueError(f"a sparse row's indices must be in [0, {vocab})")
    return torch.zeros(vocab, dtype=WIRE_DTYPE).index_put_((idx,), values)


def one_hot_rows(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """The rows of greedy tokens [...] -> [..., vocab]."""
    return torch.nn.functional.one_hot(tokens, vocab).float()
