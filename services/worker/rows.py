"""Distribution rows as they travel from one level of a chain to the next.

A level's proposal carries, for every token, the distribution the token was drawn from. On the wire:
- greedy rows are not sent at all: the row is the point mass on the token itself;
- sampled rows are sent in fp16, dense ([vocab] values) or sparse (indices and values of the non-zero
  entries, what top-k / top-p leave), whichever is smaller.
Reduced precision is exact only because the sender samples from the reduced rows: `round_trip` is
applied by the sender before it samples or accepts, and the receiver decodes the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WIRE_DTYPE = torch.float16
INDEX_BYTES = 4  # int32 token ids in a sparse row
VALUE_BYTES = 2  # fp16 values


def round_trip(probs: torch.Tensor) -> torch.Tensor:
    """The rows a receiver will decode: fp16, renormalised in fp32. [..., vocab] -> [..., vocab]."""
    reduced = probs.to(WIRE_DTYPE).float()
    return reduced / reduced.sum(-1, keepdim=True)


@dataclass(frozen=True)
class WireRow:
    """One encoded row: dense values, or sparse indices + values."""

    values: bytes
    indices: bytes | None  # None for a dense row

    @property
    def nbytes(self) -> int:
        return len(self.values) + (len(self.indices) if self.indices is not None else 0)


def encode_row(probs: torch.Tensor) -> WireRow:
    """Encodes one row [vocab] (already passed through `round_trip`)."""
    half = probs.to(WIRE_DTYPE).cpu()
    nonzero = half.nonzero().squeeze(-1)
    if nonzero.numel() * (INDEX_BYTES + VALUE_BYTES) < half.numel() * VALUE_BYTES:
        return WireRow(values=half[nonzero].numpy().tobytes(), indices=nonzero.int().numpy().tobytes())
    return WireRow(values=half.numpy().tobytes(), indices=None)


def decode_row(row: WireRow, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The row [vocab] in fp32, exactly as `round_trip` gave it to the sender."""
    values = torch.frombuffer(bytearray(row.values), dtype=WIRE_DTYPE)
    if row.indices is None:
        dense = values
    else:
        idx = torch.frombuffer(bytearray(row.indices), dtype=torch.int32).long()
        dense = torch.zeros(vocab, dtype=WIRE_DTYPE).index_put_((idx,), values)
    dense = dense.float()
    return (dense / dense.sum()).to(device)


def one_hot_rows(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """The rows of greedy tokens [...] -> [..., vocab]."""
    return torch.nn.functional.one_hot(tokens, vocab).float()
