"""The model-free level: prompt lookup, drafting by n-gram matching over each row's own tokens.

A chain may start with it (`lookup,29m`, `lookup,1m,29m`): it proposes the tokens that followed the most
recent earlier occurrence of the row's last n tokens (n from `max_ngram` down to `min_ngram`), up to the
window, in the prompt or in the output so far. Text that copies its input (code being edited, tables,
answers that quote their sources) gets long proposals for no forward pass at all; a row with no match
proposes nothing, and its next level drafts or verifies it as if the lookup were not there.

It is a `Worker` that runs in the router's process: it keeps each row's tokens under the batch's state id
as a model keeps its KV state (a prefill, then per step a rollback and the pending tokens, and the draft's
tokens but its last as cached), so the chain step drives it like any drafter, and a state rebuilt from the
rows' tokens (`ChainBatch._resync`) rebuilds it too.

A proposal is a point mass: it carries no distribution rows, and the next level accepts token x with its
own probability p(x) (speculative sampling with q = 1 on x; on rejection it samples p with x removed), or,
under coupled sampling, iff its own pick is x. Either way the output is the target's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from specrouter.worker.calls import RowStep, StateError, StepResult, UnknownStateError, VerifyRow

LOOKUP = "lookup"
MAX_NGRAM = 3
MIN_NGRAM = 1


def lookup_proposal(tokens: Sequence[int], window: int, max_ngram: int = MAX_NGRAM,
                    min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to `window` tokens that followed the most recent earlier occurrence of the last n tokens of
    `tokens`, for the longest n in [min_ngram, max_ngram] that occurs; [] if none does."""
    if window <= 0 or len(tokens) < min_ngram + 1:
        return []
    seq = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        # candidate starts i with seq[i:i+n] == the last n tokens, and i + n < len(seq) (a token follows)
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)                       # [L - n, n]
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start:start + window].tolist()
    return []


class LookupProposer:
    """The lookup level as a worker of the pool (see the module's docstring). Thread-safe: batches of
    different chains call it from the batcher's thread and the fan-out pool alike."""

    remote = False
    parameters = 0

    def __init__(self, name: str = LOOKUP, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.name = name
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._states: dict[str, dict[str, list[int]]] = {}   # state id -> row id -> tokens fed so far
        self._lock = threading.Lock()

    def state_ids(self) -> list[str]:
        with self._lock:
            return list(self._states)

    def prefill(self, state_id: str, rows: Sequence[tuple[str, Sequence[int]]], predictions: int = 0,
                ) -> StepResult:
        with self._lock:
            state = self._states.setdefault(state_id, {})
            clash = [row_id for row_id, _ in rows if row_id in state]
            if clash:
                raise StateError(f"rows {clash} are already in state {state_id!r} of {self.name!r}")
            for row_id, tokens in rows:
                state[row_id] = list(tokens)
        return StepResult(tokens=[[] for _ in rows], rows=[None] * len(rows))

    def draft(self, state_id: str, level: int, window: int, rows: Sequence[RowStep], hand_up: bool = True,
              ) -> StepResult:
        with self._lock:
            state = self._states.get(state_id)
            if state is None:
                raise UnknownStateError(f"{self.name!r} has no state {state_id!r} (released, or never prefilled)")
            missing = [r.row_id for r in rows if r.row_id not in state]
            if missing:
                raise StateError(f"rows {missing} are not in state {state_id!r} of {self.name!r}")
            histories = [state[r.row_id] for r in rows]
            for r, tokens in zip(rows, histories):
                if r.rollback > len(tokens):
                    raise StateError(f"row {r.row_id!r} of {self.name!r} holds {len(tokens)} tokens; cannot roll "
                                     f"back {r.rollback}")
                del tokens[len(tokens) - r.rollback:]
                tokens.extend(r.pending)
            proposals = [lookup_proposal(tokens, window, self.max_ngram, self.min_ngram) for tokens in histories]
            for tokens, proposal in zip(histories, proposals):   # cached as a model caches its draft: all but
                tokens.extend(proposal[:-1])                      # the last token, which it never fed
        return StepResult(tokens=proposals, rows=[None] * len(rows))

    def verify(self, state_id: str, level: int, rows: Sequence[VerifyRow], hand_up: bool) -> StepResult:
        raise ValueError(f"{self.name!r} drafts only: it can start a chain, never verify")

    def release(self, state_id: str, row_ids: Sequence[str] | None = None) -> None:
        with self._lock:
            if row_ids is None:
                self._states.pop(state_id, None)
                return
            state = self._states.get(state_id)
            if state is None:
                return
            for row_id in row_ids:
                state.pop(row_id, None)
            if not state:
                del self._states[state_id]
