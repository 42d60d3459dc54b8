"""Masked KV state: the paper's StateManager, made exact.

Rows of a batch accept different numbers of tokens, so after a cycle they disagree on how much of the
cache is still valid. Instead of copying caches, every physical column carries a validity bit:

    cache_tokens [S, L]   token id at each physical column
    cache_mask   [S, L]   True where the entry is part of the row's sequence, False for a hole
    keys/values  per layer [S, H, L, D]

- Logical rollback of r_b tokens for row b clears its last r_b valid bits; attention ignores holes.
- Physical truncation drops trailing columns that are holes in every row (at least r_min = min_b r_b).
- Position ids are logical: a new token's position is the number of valid entries before it in its row.
  Keys are stored already rotated by their logical positions, so moving columns never changes them.
- Compaction left-aligns every row's valid entries when holes pile up.

Rows live in slots (the S physical rows), so requests come and go without copying the others' caches:
a row that leaves frees its slot in place (a free slot is all holes: it attends nothing and nothing
attends it), and a row that joins is written into a free slot, only its own entries copied. Free slots
are dropped by a compaction once more than FREE_SLOT_FRACTION of the slots are free; rows are appended
as new slots only when none is free.

Keys and values live in buffers with room past L (`key_room`, `value_room`, per layer [S, H, C >= L, D]);
`keys[l]` is the view of the first L columns. A forward pass writes its new columns into the room in place
instead of concatenating the whole cache each step, and truncation only shortens the view. A buffer grows
(one copy) when a block or a joining row outruns its room, or when rows join a state without free slots.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specrouter.contract.errors import StateError

ROOM_MIN = 64               # columns of room a buffer is given past what it holds when it grows
FREE_SLOT_FRACTION = 0.25   # a leave compacts the slots once more than this fraction of them are free


def room_for(length: int) -> int:
    """Columns of a buffer grown to hold `length`: half as many again, at least ROOM_MIN more."""
    return length + max(ROOM_MIN, length // 2)


def grown(room: torch.Tensor, length: int, capacity: int, slots: int | None = None) -> torch.Tensor:
    """A buffer [slots, H, capacity, D] whose first B slots hold the first `length` columns of room
    [B, H, C, D]; the rest is uninitialised."""
    b, h, _, d = room.shape
    out = room.new_empty(b if slots is None else slots, h, capacity, d)
    out[:b, :, :length] = room[:, :, :length]
    return out


@dataclass
class MaskedKVState:
    slots: list[str | None]     # the row in each physical slot; None: a free slot (all holes)
    keys: list[torch.Tensor]    # per layer [S, H, L, D]
    values: list[torch.Tensor]  # per layer [S, H, L, D]
    tokens: torch.Tensor        # [S, L] long
    mask: torch.Tensor          # [S, L] bool, True = valid
    key_room: list[torch.Tensor] | None = None    # per layer [S, H, C >= L, D]; keys[l] is its first L columns
    value_room: list[torch.Tensor] | None = None
    last_used: float = field(default_factory=time.monotonic)

    @classmethod
    def empty(cls, row_ids: list[str], layers: int, kv_heads: int, head_dim: int,
              dtype: torch.dtype, device: torch.device) -> MaskedKVState:
        b = len(row_ids)
        kv = lambda: torch.zeros(b, kv_heads, 0, head_dim, dtype=dtype, device=device)  # noqa: E731
        return cls(
            slots=list(row_ids),
            keys=[kv() for _ in range(layers)],
            values=[kv() for _ in range(layers)],
            tokens=torch.zeros(b, 0, dtype=torch.long, device=device),
            mask=torch.zeros(b, 0, dtype=torch.bool, device=device),
        )

    @property
    def row_ids(self) -> list[str]:
        """The rows held, in slot order."""
        return [r for r in self.slots if r is not None]

    @property
    def batch_size(self) -> int:
        """Physical slots S, free ones included."""
        return len(self.slots)

    @property
    def length(self) -> int:
        """Physical length L (valid entries plus holes)."""
        return self.tokens.shape[1]

    def free_slots(self) -> list[int]:
        return [i for i, r in enumerate(self.slots) if r is None]

    def live_holes(self) -> int:
        """How many slots of the batch are holes (free)."""
        return len(self.free_slots())

    def slot_index(self, row_id: str) -> int:
        try:
            return self.slots.index(row_id)
        except ValueError:
            raise StateError(f"row {row_id!r} is not in this state (it holds {self.row_ids})") from None

    def valid_lengths(self) -> torch.Tensor:
        """Logical length of every slot: [S] (0 for a free one)."""
        return self.mask.sum(dim=1)

    def holes(self) -> int:
        """Holes among the entries of the rows held (free slots not counted)."""
        free = self.free_slots()
        if not free:
            return int((~self.mask).sum())
        live = [i for i, r in enumerate(self.slots) if r is not None]
        return int((~self.mask[live]).sum())

    def row_tokens(self, slot: int) -> list[int]:
        return self.tokens[slot][self.mask[slot]].tolist()

    def append(self, key_room: list[torch.Tensor], value_room: list[torch.Tensor],
               tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """Takes the buffers a forward pass wrote k more columns into, and the tokens [S, k] and validity
        [S, k] it appended."""
        length = self.length + tokens.shape[1]
        self.key_room, self.value_room = key_room, value_room
        self.keys = [k[:, :, :length] for k in key_room]
        self.values = [v[:, :, :length] for v in value_room]
        self.tokens = torch.cat([self.tokens, tokens], dim=1)
        self.mask = torch.cat([self.mask, valid], dim=1)

    def rollback(self, counts: torch.Tensor) -> None:
        """Invalidates the last counts[s] valid entries of every slot s, then truncates trailing holes."""
        counts = counts.to(self.mask.device)
        if bool((counts < 0).any()) or bool((counts > self.valid_lengths()).any()):
            raise StateError(f"rollback {counts.tolist()} exceeds the rows' lengths {self.valid_lengths().tolist()}")
        if bool((counts > 0).any()):
            valid_from_right = self.mask.flip(1).cumsum(1).flip(1)  # [S, L] valid entries at or after column
            self.mask = self.mask & (valid_from_right > counts[:, None])
        self.truncate()

    def drop_columns(self, count: int) -> None:
        """Drops the last `count` physical columns, whatever they hold (the caller knows they are entries
        it has just appended and now rejects, or holes)."""
        if not 0 <= count <= self.length:
            raise StateError(f"cannot drop {count} of {self.length} columns")
        self._keep_columns(self.length - count)

    def truncate(self) -> None:
        """Drops the trailing columns that are holes in every slot."""
        any_valid = self.mask.any(dim=0)
        keep = int(any_valid.nonzero().max()) + 1 if bool(any_valid.any()) else 0
        if keep < self.length:
            self._keep_columns(keep)

    @torch.inference_mode()
    def compact(self) -> None:
        """Drops the free slots and left-aligns every row's valid entries: one copy of the rows held, into
        buffers with room."""
        if not self.free_slots() and self.holes() == 0:
            return
        live = [i for i, r in enumerate(self.slots) if r is not None]
        rows = torch.tensor(live, dtype=torch.long, device=self.mask.device)                # [S']
        mask = self.mask[rows]
        lengths = mask.sum(dim=1)
        new_len = int(lengths.max()) if live else 0
        # Stable sort puts valid columns first, in their original order: [S', L']
        order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :new_len]
        self.slots = [self.slots[i] for i in live]
        self.tokens = self.tokens[rows].gather(1, order)
        self.mask = torch.arange(new_len, device=self.mask.device)[None, :] < lengths[:, None]

        def moved(t: torch.Tensor) -> torch.Tensor:
            out = t.new_empty(len(live), t.shape[1], room_for(new_len), t.shape[3])
            out[:, :, :new_len] = t[rows[:, None], :, order].transpose(1, 2)  # [S', L', H, D] -> [S', H, L', D]
            return out

        self.key_room = [moved(k) for k in self.keys]
        self.value_room = [moved(v) for v in self.values]
        self.keys = [k[:, :, :new_len] for k in self.key_room]
        self.values = [v[:, :, :new_len] for v in self.value_room]

    def select(self, row_ids: list[str]) -> None:
        """Keeps only `row_ids`, in that order, one to a slot (a copy; `leave` frees slots in place)."""
        index = {r: i for i, r in enumerate(self.slots) if r is not None}
        missing = [r for r in row_ids if r not in index]
        if missing:
            raise StateError(f"rows {missing} are not in this state (it holds {self.row_ids})")
        if row_ids == self.slots:
            return
        rows = torch.tensor([index[r] for r in row_ids], dtype=torch.long, device=self.mask.device)
        self.slots = list(row_ids)
        self.tokens, self.mask = self.tokens[rows], self.mask[rows]
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.key_room = self.value_room = None
        self.truncate()

    @torch.inference_mode()
    def leave(self, row_ids: Sequence[str]) -> None:
        """Frees the rows' slots in place: their entries become holes. Compacts once more than
        FREE_SLOT_FRACTION of the slots are free."""
        missing = [r for r in row_ids if r not in self.slots]
        if missing:
            raise StateError(f"rows {missing} are not in this state (it holds {self.row_ids})")
        if not row_ids:
            return
        freed = [self.slot_index(r) for r in row_ids]
        for s in freed:
            self.slots[s] = None
        index = torch.tensor(freed, dtype=torch.long, device=self.mask.device)
        self.mask[index] = False
        self.tokens[index] = 0
        if self.live_holes() > FREE_SLOT_FRACTION * self.batch_size:
            self.compact()
        else:
            self.truncate()

    @torch.inference_mode()
    def join(self, other: MaskedKVState) -> None:
        """Writes `other`'s rows into free slots, then into new slots after the others; only their own
        entries are copied, unless the buffers must grow (no free slot left, or a row longer than the room).
        Columns a joining row does not fill, and those added for a longer row, are holes."""
        clash = set(self.row_ids) & set(other.row_ids)
        if clash:
            raise StateError(f"rows {sorted(clash)} are already in this state")
        rows = other.row_ids
        free = self.free_slots()[: len(rows)]
        targets = free + list(range(self.batch_size, self.batch_size + len(rows) - len(free)))
        n, length = other.length, max(self.length, other.length)
        self._reserve(self.batch_size + len(rows) - len(free), length)
        device = self.mask.device
        dst = torch.tensor(targets, dtype=torch.long, device=device)
        src = torch.tensor([other.slot_index(r) for r in rows], dtype=torch.long, device=other.mask.device)
        for mine, theirs in ((self.key_room, other.keys), (self.value_room, other.values)):
            for room, kv in zip(mine, theirs):
                room[dst, :, :n] = kv[src].to(room.device)
                room[dst, :, n:length] = 0
        self.tokens[dst] = 0
        self.mask[dst] = False
        self.tokens[dst, :n] = other.tokens[src].to(device)
        self.mask[dst, :n] = other.mask[src].to(device)
        for s, r in zip(targets, rows):
            self.slots[s] = r

    def _reserve(self, slots: int, length: int) -> None:
        """Makes the state `slots` slots by `length` columns; what is added is holes with zero keys and
        values. The buffers are reallocated (one copy) only when the slots or the room do not suffice."""
        b, old = self.batch_size, self.length
        key_room, value_room = self.key_room or self.keys, self.value_room or self.values
        capacity = key_room[0].shape[2] if key_room else 0
        if slots > b or length > capacity:
            capacity = max(capacity, room_for(length))
            key_room = [grown(k, old, capacity, slots) for k in key_room]
            value_room = [grown(v, old, capacity, slots) for v in value_room]
        for room in (*key_room, *value_room):
            room[:, :, old:length] = 0   # past every view: unwritten, or left by a rollback
            room[b:slots, :, :old] = 0
        self.key_room, self.value_room = key_room, value_room
        self.keys = [k[:, :, :length] for k in key_room]
        self.values = [v[:, :, :length] for v in value_room]
        if slots > b or length > old:
            tokens = self.tokens.new_zeros(slots, length)
            mask = self.mask.new_zeros(slots, length)
            tokens[:b, :old], mask[:b, :old] = self.tokens, self.mask
            self.tokens, self.mask = tokens, mask
        self.slots = self.slots + [None] * (slots - b)

    def _keep_columns(self, keep: int) -> None:
        """Keeps the first `keep` columns: views, so the room behind them stays for the next append."""
        self.tokens, self.mask = self.tokens[:, :keep], self.mask[:, :keep]
        self.keys = [k[:, :, :keep] for k in self.keys]
        self.values = [v[:, :, :keep] for v in self.values]
