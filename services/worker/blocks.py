"""Rows of tokens as one block for a forward pass, and reading a block's last columns back per row.

A batch's rows hold different numbers of pending tokens: they are right-padded into a block [B, K] with a
validity mask, and what a row needs of the output sits at its own last valid columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_rows(seqs: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded tokens [B, K] and validity [B, K]."""
    width = max((len(s) for s in seqs), default=0)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        valid[i, : len(s)] = True
    return tokens.to(device), valid.to(device)


def last_columns(valid: torch.Tensor, n: int) -> torch.Tensor:
    """[B, n]: per right-padded row, the columns of its last `n` valid positions; a row with fewer repeats its
    first column in front of them."""
    lengths = valid.sum(1)                                                                  # [B]
    return (lengths[:, None] - n + torch.arange(n, device=valid.device)[None, :]).clamp(min=0)


def last_argmax(logits: torch.Tensor, valid: torch.Tensor, n: int) -> list[list[int]]:
    """Per row, the argmax of the logits at its last `n` valid positions, from logits [B, n, V] at the
    columns `last_columns` names."""
    argmax = logits.argmax(-1).tolist()                                                     # [B, n]
    return [row[max(0, n - length):] for row, length in zip(argmax, valid.sum(1).tolist())]
