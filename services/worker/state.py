"""Masked KV state: the paper's StateManager, made exact.

Rows of a batch accept different numbers of tokens, so after a cycle they disagree on how much of the
cache is still valid. Instead of copying caches, every physical column carries a validity bit:

    cache_tokens [B, L]   token id at each physical column
    cache_mask   [B, L]   True where the entry is part of the row's sequence, False for a hole
    keys/values  per layer [B, H, L, D]

- Logical rollback of r_b tokens for row b clears its last r_b valid bits; attention ignores holes.
- Physical truncation drops trailing columns that are holes in every row (at least r_min = min_b r_b).
- Position ids are logical: a new token's position is the number of valid entries before it in its row.
  Keys are stored already rotated by their logical positions, so moving columns never changes them.
- Compaction left-aligns every row's valid entries when holes pile up.
- Rows join (another state's rows appended, the shorter side padded with holes) and leave (filtered).

Keys and values live in buffers with room past L (`key_room`, `value_room`, per layer [B, H, C >= L, D]);
`keys[l]` is the view of the first L columns. A forward pass writes its new columns into the room in place
instead of concatenating the whole cache each step, and truncation only shortens the view. Operations
that build new tensors (join, leave, compaction) leave the state without room; the next forward pass
makes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


class StateError(ValueError):
    """A state operation that the state cannot honour (too long a rollback, unknown rows, ...)."""


@dataclass
class MaskedKVState:
    row_ids: list[str]
    keys: list[torch.Tensor]    # per layer [B, H, L, D]
    values: list[torch.Tensor]  # per layer [B, H, L, D]
    tokens: torch.Tensor        # [B, L] long
    mask: torch.Tensor          # [B, L] bool, True = valid
    key_room: list[torch.Tensor] | None = None    # per layer [B, H, C >= L, D]; keys[l] is its first L columns
    value_room: list[torch.Tensor] | None = None
    last_used: float = field(default_factory=time.monotonic)

    @classmethod
    def empty(cls, row_ids: list[str], layers: int, kv_heads: int, head_dim: int,
              dtype: torch.dtype, device: torch.device) -> MaskedKVState:
        b = len(row_ids)
        kv = lambda: torch.zeros(b, kv_heads, 0, head_dim, dtype=dtype, device=device)  # noqa: E731
        return cls(
            row_ids=list(row_ids),
            keys=[kv() for _ in range(layers)],
            values=[kv() for _ in range(layers)],
            tokens=torch.zeros(b, 0, dtype=torch.long, device=device),
            mask=torch.zeros(b, 0, dtype=torch.bool, device=device),
        )

    @property
    def batch_size(self) -> int:
        return len(self.row_ids)

    @property
    def length(self) -> int:
        """Physical length L (valid entries plus holes)."""
        return self.tokens.shape[1]

    def valid_lengths(self) -> torch.Tensor:
        """Logical length of every row: [B]."""
        return self.mask.sum(dim=1)

    def holes(self) -> int:
        return int((~self.mask).sum())

    def row_tokens(self, b: int) -> list[int]:
        return self.tokens[b][self.mask[b]].tolist()

    def append(self, key_room: list[torch.Tensor], value_room: list[torch.Tensor],
               tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """Takes the buffers a forward pass wrote k more columns into, and the tokens [B, k] and validity
        [B, k] it appended."""
        length = self.length + tokens.shape[1]
        self.key_room, self.value_room = key_room, value_room
        self.keys = [k[:, :, :length] for k in key_room]
        self.values = [v[:, :, :length] for v in value_room]
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.mask = torch.cat([self.mask, valid], dim=1)

    def rollback(self, counts: torch.Tensor) -> None:
        """Invalidates the last counts[b] valid entries of every row b, then truncates trailing holes."""
        counts = counts.to(self.mask.device)
        if bool((counts < 0).any()) or bool((counts > self.valid_lengths()).any()):
            raise StateError(f"rollback {counts.tolist()} exceeds the rows' lengths {self.valid_lengths().tolist()}")
        if bool((counts > 0).any()):
            valid_from_right = self.mask.flip(1).cumsum(1).flip(1)  # [B, L] valid entries at or after column
            self.mask = self.mask & (valid_from_right > counts[:, None])
        self.truncate()

    def truncate(self) -> None:
        """Drops the trailing columns that are holes in every row."""
        any_valid = self.mask.any(dim=0)
        keep = int(any_valid.nonzero().max()) + 1 if bool(any_valid.any()) else 0
        if keep < self.length:
            self._keep_columns(keep)

    def compact(self) -> None:
        """Left-aligns every row's valid entries and drops the columns that then hold only holes."""
        if self.holes() == 0:
            return
        lengths = self.valid_lengths()
        # Stable sort puts valid columns first, in their original order: [B, L]
        order = torch.sort((~self.mask).to(torch.int8), dim=1, stable=True).indices
        new_len = int(lengths.max()) if self.batch_size else 0
        order = order[:, :new_len]
        self.tokens = self.tokens.gather(1, order)
        self.mask = torch.arange(new_len, device=self.mask.device)[None, :] < lengths[:, None]
        idx = order[:, None, :, None]
        self.keys = [k.gather(2, idx.expand(-1, k.shape[1], -1, k.shape[3])) for k in self.keys]
        self.values = [v.gather(2, idx.expand(-1, v.shape[1], -1, v.shape[3])) for v in self.values]
        self.key_room = self.value_room = None

    def select(self, row_ids: list[str]) -> None:
        """Keeps only `row_ids`, in that order (rows leaving the batch, or a new row order)."""
        index = {r: i for i, r in enumerate(self.row_ids)}
        missing = [r for r in row_ids if r not in index]
        if missing:
            raise StateError(f"rows {missing} are not in this state (it holds {self.row_ids})")
        if row_ids == self.row_ids:
            return
        rows = torch.tensor([index[r] for r in row_ids], dtype=torch.long, device=self.mask.device)
        self.row_ids = list(row_ids)
        self.tokens, self.mask = self.tokens[rows], self.mask[rows]
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.key_room = self.value_room = None
        self.truncate()

    def join(self, other: MaskedKVState) -> None:
        """Appends `other`'s rows; the shorter side is padded on the right with holes."""
        clash = set(self.row_ids) & set(other.row_ids)
        if clash:
            raise StateError(f"rows {sorted(clash)} are already in this state")
        length = max(self.length, other.length)
        a, b = self._padded(length), other._padded(length)
        self.row_ids = self.row_ids + other.row_ids
        self.tokens = torch.cat([a[0], b[0]])
        self.mask = torch.cat([a[1], b[1]])
        self.keys = [torch.cat([x, y]) for x, y in zip(a[2], b[2])]
        self.values = [torch.cat([x, y]) for x, y in zip(a[3], b[3])]
        self.key_room = self.value_room = None

    def _padded(self, length: int):
        pad = length - self.length
        if pad == 0:
            return self.tokens, self.mask, self.keys, self.values
        b = self.batch_size
        tokens = torch.cat([self.tokens, self.tokens.new_zeros(b, pad)], dim=1)
        mask = torch.cat([self.mask, self.mask.new_zeros(b, pad)], dim=1)
        grow = lambda t: torch.cat([t, t.new_zeros(b, t.shape[1], pad, t.shape[3])], dim=2)  # noqa: E731
        return tokens, mask, [grow(k) for k in self.keys], [grow(v) for v in self.values]

    def _keep_columns(self, keep: int) -> None:
        """Keeps the first `keep` columns: views, so the room behind them stays for the next append."""
        self.tokens, self.mask = self.tokens[:, :keep], self.mask[:, :keep]
        self.keys = [k[:, :, :keep] for k in self.keys]
        self.values = [v[:, :, :keep] for v in self.values]
