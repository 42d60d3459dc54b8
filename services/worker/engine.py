"""The operations a worker performs on its model's states: prefill, draft, verify, release.

Every operation names its state by an opaque id and its rows by row id; rows may be at different
lengths. A call covers every row of its state, in any order (its blocks are scattered to the rows'
slots and the logits gathered back; the state is not reordered), and carries per row the rollback left
over from the last cycle and the tokens the model has not seen yet (at least the last emitted token,
more when the model sat out cycles and must catch up), so a cycle costs one round trip per level. Each
call returns the timings of its forward passes for the profiler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specrouter.worker import lookahead
from specrouter.worker import rows as wire
from specrouter.contract.errors import ContextLengthError, RowError, RowStateError, StateError, UnknownStateError
from specrouter.contract.calls import ForwardTiming, RowStep, StepResult, VerifyRow, WorkerInfo
from specrouter.worker.blocks import last_argmax, last_columns, pad_rows
from specrouter.worker.forward import ModelForward
from specrouter.worker.sampling import (BatchSampling, next_token_probs, row_uniforms, sample, token_presence,
                                       with_coupled_picks)
from specrouter.worker.state import MaskedKVState
from specrouter.worker.verify import proposal_similarity, verify_greedy, verify_proposal


@dataclass(frozen=True)
class EngineSettings:
    state_ttl_s: float = 600.0           # states untouched this long are reclaimed
    compact_hole_fraction: float = 0.5   # compact a state when this fraction of its entries are holes
    draft_lookahead: int = 4             # guesses fed per pass with the drafted token, one row drafting (0: none)


class WorkerEngine:
    """One model's worker in this process: its states and the draft, verify, prefill and release steps. The
    worker's server runs it behind gRPC; the router runs it directly (the `Worker` interface) in an
    in-process pool."""

    remote = False   # its calls run in the caller's process

    def __init__(self, name: str, forward: ModelForward, settings: EngineSettings = EngineSettings(),
                 tokenizer_sha256: str = ""):
        self.name = name
        self.address = f"in-process:{name}"
        self.forward = forward
        self.settings = settings
        self.vocab = forward.vocab_size
        self.info = WorkerInfo(model_name=name, parameters=sum(p.numel() for p in forward.model.parameters()),
                               vocab_size=forward.vocab_size, context_length=forward.context_length,
                               tokenizer_sha256=tokenizer_sha256, device=str(forward.device),
                               dtype=str(forward.dtype).removeprefix("torch."))
        self._states: dict[str, MaskedKVState] = {}
        self._lock = threading.Lock()

    # -- states -----------------------------------------------------------------------------------

    def state_ids(self) -> list[str]:
        with self._lock:
            return list(self._states)

    def live_rows(self) -> int:
        """Rows held across every state (requests in flight on this model)."""
        with self._lock:
            return sum(len(s.row_ids) for s in self._states.values())   # free slots are no rows

    def state(self, state_id: str) -> MaskedKVState:
        state = self._states.get(state_id)
        if state is None:
            raise UnknownStateError(f"worker {self.name!r} has no state {state_id!r} (released, expired or never prefilled)")
        state.last_used = time.monotonic()
        return state

    def reclaim_expired(self, now: float | None = None) -> list[str]:
        """Drops states not touched for `state_ttl_s`; returns their ids."""
        with self._lock:
            return self._drop_expired(time.monotonic() if now is None else now)

    def _drop_expired(self, now: float) -> list[str]:
        expired = [s for s, st in self._states.items() if now - st.last_used > self.settings.state_ttl_s]
        for s in expired:
            del self._states[s]
        return expired

    def release(self, state_id: str, row_ids: Sequence[str] | None = None) -> None:
        """Releases a whole state, or only some of its rows (requests leaving the batch)."""
        with self._lock:
            state = self.state(state_id)
            if row_ids is None or set(row_ids) >= set(state.row_ids):
                del self._states[state_id]
                return
            leaving = set(row_ids)
            state.leave([r for r in state.row_ids if r in leaving])

    # -- operations -------------------------------------------------------------------------------

    def probe(self, timeout_s: float = 2.0) -> None:
        """An engine in this process always answers."""

    def close(self) -> None:
        """Nothing to let go of: the engine belongs to whoever built it, its states expire by their TTL."""

    def prefill(self, state_id: str, rows: Sequence[tuple[str, Sequence[int]]], predictions: int = 0) -> StepResult:
        """Processes each row's tokens; creates the state, or joins the rows to it. With `predictions`, each
        row's `tokens` are the model's argmax next token after each of its last `predictions` tokens."""
        if predictions < 0:
            raise StateError(f"predictions must be >= 0, got {predictions}")
        with self._lock:
            self._drop_expired(time.monotonic())
            ids = [r for r, _ in rows]
            if not ids:   # a state without rows would fail every later call
                raise ValueError(f"prefill of state {state_id!r} names no rows; give at least one")
            if len(set(ids)) != len(ids):
                raise StateError(f"duplicate row ids in prefill: {ids}")
            self._check_tokens({r: t for r, t in rows})
            self._check_context({r: len(t) for r, t in rows})
            joined = self._states[state_id].row_ids if state_id in self._states else ()
            clash = [r for r in ids if r in joined]
            if clash:
                raise RowStateError(f"rows {clash} are already in state {state_id!r} of model {self.name!r}", clash)
            fresh = self.forward.empty_state(ids)
            tokens, valid = pad_rows([t for _, t in rows], self.forward.device)
            timings = []
            guesses: list[list[int]] = [[] for _ in ids]
            predictions = min(predictions, tokens.shape[1])   # a row has no more positions than its tokens
            if tokens.shape[1]:
                logits, timing = self.forward(fresh, tokens, valid, logits_at=last_columns(valid, predictions))
                timings.append(timing)
                if predictions:
                    guesses = last_argmax(logits, valid, predictions)
            if state_id in self._states:
                self._states[state_id].join(fresh)
                self._states[state_id].last_used = time.monotonic()
            else:
                self._states[state_id] = fresh
            return StepResult(tokens=guesses, rows=[None] * len(ids), timings=timings)

    def draft(self, state_id: str, level: int, window: int, rows: Sequence[RowStep], hand_up: bool = True) -> StepResult:
        """Samples `window` tokens per row autoregressively; returns them with the rows they came from.

        `hand_up`: the draft goes to another level, so its tokens are drawn from the rows rounded to wire
        precision, which are returned (the verifier must see the distribution each token was really drawn
        from). Without it the drafter is the target, decoding on its own: its tokens are its output, drawn
        from the full-precision distribution, and no rows are returned."""
        if window < 1:
            raise StateError(f"window must be >= 1, got {window}")
        with self._lock:
            state, slots = self._prepare(state_id, rows, extra_tokens=window)
            s = BatchSampling([r.sampling for r in rows], self.forward.device)
            tokens, valid = pad_rows([r.pending for r in rows], self.forward.device)
            logits, timing = self._forward(state, slots, tokens, valid, logits_at=last_columns(valid, 1))
            timings = [timing]
            b = len(rows)
            index = torch.arange(b, device=logits.device)
            last = logits[:, 0]                                                           # [B, V]
            presence = self._presence(state, slots) if s.any_penalty else None
            greedy = s.all_greedy and presence is None   # the argmax; no rows are made or sent
            if greedy and b == 1 and self.settings.draft_lookahead and window > 1:
                return self._draft_looking_ahead(state, slots[0], window, last[0], timings)
            if not greedy:
                u = torch.stack([row_uniforms(r.sampling.seed, r.cycle, level, window) for r in rows])  # [B, W]
                # [B] absolute position of each row's first drafted token, where a row picks coupled
                base = self._lengths(state, slots) if s.any_coupled else None
            drafted, drafted_rows = [], []
            for i in range(window):
                if greedy:
                    x = last.argmax(-1)                                                    # [B]
                else:
                    probs = next_token_probs(last, s, presence)                           # [B, V] fp32
                    if hand_up:
                        rows_fp16 = wire.to_wire(probs)                                   # [B, V]
                        x = sample(wire.as_probs(rows_fp16), u[:, i])                     # [B]
                        drafted_rows.append(rows_fp16)
                    else:
                        x = sample(probs, u[:, i])                                        # [B]
                    if s.any_coupled:   # picked from fp32: a coupled proposal is checked by equality, no rows
                        x = with_coupled_picks(x[:, None], probs[:, None], s, rows, base[:, None] + i)[:, 0]
                drafted.append(x)
                if presence is not None:
                    presence[index, x] = True
                if i + 1 < window:
                    logits, timing = self._forward(state, slots, x[:, None],
                                                   torch.ones_like(x[:, None], dtype=torch.bool))
                    timings.append(timing)
                    last = logits[:, 0]
            out_tokens = torch.stack(drafted, 1).tolist()                                 # [B, W]
            if greedy or not hand_up:
                return StepResult(tokens=out_tokens, rows=[None] * b, timings=timings)
            out_rows = torch.stack(drafted_rows, 1)                                       # [B, W, V]
            return StepResult(
                tokens=out_tokens,
                rows=[None if r.sampling.greedy or coupled else out_rows[i]
                      for i, (r, coupled) in enumerate(zip(rows, s.coupled))],
                timings=timings,
            )

    def _draft_looking_ahead(self, state: MaskedKVState, slot: int, window: int, last: torch.Tensor,
                             timings: list[ForwardTiming]) -> StepResult:
        """A greedy `draft` of the one row in `slot` that feeds, with each drafted token, guesses of the
        tokens after it (`lookahead.guess`) and keeps the guesses that are its own argmax: the tokens of one
        pass a token, in fewer passes. `last` [V]: the logits after the pending tokens. The state ends as
        one pass a token leaves it: the pending tokens and the first W - 1 drafted ones (guesses not kept
        are rolled back).

        Only a state of one row looks ahead: with several, a pass is needed until the row whose guesses
        fail has drafted, so the passes hardly drop while each one grows; and sampled rows draw the guessed
        token too rarely to pay."""
        history = state.row_tokens(slot)
        context = np.empty(len(history) + window, dtype=np.int64)   # the row's tokens, then its drafts
        context[:len(history)] = history
        drafted = [int(last.argmax())]
        while len(drafted) < window:
            room = window - 1 - len(drafted)                 # guesses that may follow the last drafted token
            end = len(history) + len(drafted)
            context[len(history):end] = drafted
            block = [drafted[-1], *lookahead.guess(context[:end], min(self.settings.draft_lookahead, room))]
            fed = torch.ones(1, len(block), dtype=torch.bool, device=self.forward.device)
            logits, timing = self._forward(state, [slot], torch.tensor([block], device=fed.device), fed)
            timings.append(timing)
            argmax = logits[0].argmax(-1).tolist()                                        # [k]
            kept = 0
            while kept + 1 < len(block) and argmax[kept] == block[kept + 1]:
                kept += 1
            drafted.extend(block[1:kept + 1])
            drafted.append(argmax[kept])
            if kept + 1 < len(block):   # the guesses not kept are the block's last columns: holes elsewhere
                state.drop_columns(len(block) - 1 - kept)
        return StepResult(tokens=[drafted], rows=[None], timings=timings)

    def verify(self, state_id: str, level: int, rows: Sequence[VerifyRow], hand_up: bool) -> StepResult:
        """Checks each row's proposal against this model; returns accepted + recovered/bonus tokens.

        `hand_up`: the result goes to another level, so its rows are rounded to wire precision before
        they are used and returned. The target (the last level) keeps full precision.
        """
        with self._lock:
            k_max = max((len(r.proposal) for r in rows), default=0)
            state, slots = self._prepare(state_id, rows, extra_tokens=k_max + 1)
            device = self.forward.device
            b = len(rows)
            s = BatchSampling([r.sampling for r in rows], device)
            presence0 = None
            if s.any_penalty:
                presence0 = self._presence(state, slots)
            blocks = [list(r.pending) + list(r.proposal) for r in rows]
            tokens, valid = pad_rows(blocks, device)
            if s.any_coupled:   # absolute position of the token after each row's pending ones
                first = self._lengths(state, slots) + torch.tensor([len(r.pending) for r in rows], device=device)
            starts = torch.tensor([len(r.pending) - 1 for r in rows], device=device)      # [B]
            lengths = torch.tensor([len(r.proposal) for r in rows], device=device)        # [B]
            offsets = torch.arange(k_max + 1, device=device)
            positions = (starts[:, None] + offsets[None, :]).clamp(max=tokens.shape[1] - 1)  # [B, K + 1]
            p_logits, timing = self._forward(state, slots, tokens, valid, logits_at=positions)  # [B, K + 1, V]
            if s.all_greedy and not s.any_penalty:
                return self._verify_greedy(rows, p_logits, timing)
            presence = None
            if presence0 is not None:
                # the row of position i has seen the context, the pending tokens and x_1..x_i
                cols = torch.arange(tokens.shape[1], device=device)
                in_view = (cols[None, None, :] <= positions[..., None]) & valid[:, None, :]   # [B, K + 1, T]
                counts = torch.zeros(b, k_max + 1, self.vocab, dtype=torch.int32, device=device)
                counts.scatter_add_(2, tokens[:, None, :].expand(-1, k_max + 1, -1), in_view.int())
                presence = (presence0[:, None, :] | (counts > 0)).flatten(0, 1)            # [B * (K + 1), V]
            row_index = torch.arange(b, device=device).repeat_interleave(k_max + 1)
            p = next_token_probs(p_logits.flatten(0, 1), s.rows(row_index), presence).view(b, k_max + 1, self.vocab)
            only_picks = all(r.sampling.greedy or coupled for r, coupled in zip(rows, s.coupled))
            if s.any_coupled or only_picks:
                picks = p.argmax(-1)   # [B, K + 1]: the greedy rows' tokens (their rows are one-hot)
                if s.any_coupled:   # this level's own picks, from fp32, at each proposal position and one more
                    picks = with_coupled_picks(picks, p, s, rows, first[:, None] + offsets[None, :])
                if only_picks:   # each row accepts iff its pick is the proposed token
                    return self._verify_picks(rows, picks, timing)
            p_wire = None
            if hand_up:
                p_wire = wire.to_wire(p)
                p = wire.as_probs(p_wire)
            if s.any_coupled:   # a coupled row's p is the point mass on its pick: accepted iff equal
                coupled = torch.tensor(s.coupled, device=device)
                p = torch.where(coupled[:, None, None], wire.one_hot_rows(picks, self.vocab), p)
            proposal, _ = pad_rows([r.proposal for r in rows], device)
            q = torch.zeros(b, k_max, self.vocab, device=device)
            for i, r in enumerate(rows):
                k = len(r.proposal)
                if k:
                    q[i, :k] = wire.one_hot_rows(proposal[i, :k], self.vocab) if r.proposal_rows is None \
                        else wire.as_probs(r.proposal_rows.to(device))
            uniforms = [row_uniforms(r.sampling.seed, r.cycle, level, len(r.proposal) + 1) for r in rows]
            u_accept = torch.zeros(b, k_max)
            for i, u in enumerate(uniforms):
                u_accept[i, : len(u) - 1] = u[:-1]
            u_sample = torch.stack([u[-1] for u in uniforms])
            verdict = verify_proposal(proposal, lengths, q, p, u_accept, u_sample)
            similarity = proposal_similarity(q, p, lengths).tolist()
            accepted = verdict.accepted.tolist()
            nxt = verdict.next_token.tolist()
            out_tokens = [list(r.proposal[:a]) + [y] for r, a, y in zip(rows, accepted, nxt)]
            out_rows = [p_wire[i, : a + 1] if p_wire is not None and not r.sampling.greedy and not coupled else None
                        for i, (r, a, coupled) in enumerate(zip(rows, accepted, s.coupled))]
            return StepResult(tokens=out_tokens, rows=out_rows, accepted=accepted, similarity=similarity,
                              timings=[timing])

    def _verify_greedy(self, rows: Sequence[VerifyRow], p_logits: torch.Tensor, timing: ForwardTiming) -> StepResult:
        """`verify` for a batch whose rows are all greedy with no penalty: argmaxes, no distribution rows."""
        return self._verify_picks(rows, p_logits.argmax(-1), timing)                      # p_logits [B, K + 1, V]

    @staticmethod
    def _verify_picks(rows: Sequence[VerifyRow], picks: torch.Tensor, timing: ForwardTiming) -> StepResult:
        """`verify` for a batch whose rows each pick their tokens (greedy, or coupled sampling): a proposed
        token is accepted iff it is this level's pick at its position, picks [B, K + 1]; no rows are sent."""
        device = picks.device
        proposal, _ = pad_rows([r.proposal for r in rows], device)                           # [B, K]
        lengths = torch.tensor([len(r.proposal) for r in rows], device=device)           # [B]
        verdict, similarity = verify_greedy(proposal, lengths, picks)
        accepted = verdict.accepted.tolist()
        out_tokens = [list(r.proposal[:a]) + [y] for r, a, y in zip(rows, accepted, verdict.next_token.tolist())]
        return StepResult(tokens=out_tokens, rows=[None] * len(rows), accepted=accepted,
                          similarity=similarity.tolist(), timings=[timing])

    # -- helpers ----------------------------------------------------------------------------------

    def _prepare(self, state_id: str, rows: Sequence[RowStep], extra_tokens: int) -> tuple[MaskedKVState, list[int]]:
        """Checks the call's rows, then applies their rollbacks and compacts if worth it; returns the state and
        the slot of each row, in the call's order. A check that fails raises before the state changes, naming
        the rows it fails for."""
        self._drop_expired(time.monotonic())
        state = self.state(state_id)
        ids = [r.row_id for r in rows]
        held_ids = set(state.row_ids)
        missing = [r for r in ids if r not in held_ids]
        if missing:
            raise RowStateError(f"state {state_id!r} of model {self.name!r} holds no row {missing} (released, or "
                                f"never prefilled)", missing)
        if len(ids) != len(held_ids) or len(set(ids)) != len(ids):
            raise StateError(f"call names rows {sorted(ids)} but state {state_id!r} holds {sorted(state.row_ids)}")
        empty = [r.row_id for r in rows if len(r.pending) == 0]
        if empty:
            raise RowStateError(f"rows {empty} have no pending token; every row needs at least one (the last "
                                f"emitted one)", empty)
        self._check_tokens({r.row_id: [*r.pending, *getattr(r, "proposal", ())] for r in rows})
        lengths = state.valid_lengths().tolist()
        held = {r: lengths[state.slot_index(r)] for r in ids}
        too_long = [r.row_id for r in rows if not 0 <= r.rollback <= held[r.row_id]]
        if too_long:
            raise RowStateError(f"rows {too_long} ask for a rollback longer than they hold "
                                f"({[held[r] for r in too_long]} tokens)", too_long)
        self._check_context({r.row_id: held[r.row_id] - r.rollback + len(r.pending) + extra_tokens for r in rows})
        if any(r.rollback for r in rows):
            counts = torch.zeros(state.batch_size, dtype=torch.long)                       # [S], 0 for free slots
            counts[[state.slot_index(r.row_id) for r in rows]] = torch.tensor([r.rollback for r in rows])
            state.rollback(counts)
        total = len(ids) * state.length
        if total and state.holes() > self.settings.compact_hole_fraction * total:
            state.compact()
        return state, [state.slot_index(r) for r in ids]

    def _forward(self, state: MaskedKVState, slots: list[int], tokens: torch.Tensor, valid: torch.Tensor,
                 logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, ForwardTiming]:
        """Runs blocks tokens [B, k] (valid [B, k]) given in the call's order, row b in slot slots[b]; slots
        outside the call (free ones) get an all-hole block, which changes nothing. Returns logits [B, k, V]
        in the call's order, or [B, n, V] at the columns `logits_at` [B, n] (`ModelForward`)."""
        if slots == list(range(state.batch_size)):
            return self.forward(state, tokens, valid, logits_at)
        index = torch.tensor(slots, dtype=torch.long, device=tokens.device)              # [B]
        in_slots = tokens.new_zeros(state.batch_size, tokens.shape[1]).index_copy_(0, index, tokens)   # [S, k]
        valid_in_slots = valid.new_zeros(state.batch_size, valid.shape[1]).index_copy_(0, index, valid)
        at_slots = None if logits_at is None else \
            logits_at.new_zeros(state.batch_size, logits_at.shape[1]).index_copy_(0, index, logits_at)  # [S, n]
        logits, timing = self.forward(state, in_slots, valid_in_slots, at_slots)          # [S, k or n, V]
        return logits[index], timing

    @staticmethod
    def _lengths(state: MaskedKVState, slots: list[int]) -> torch.Tensor:
        """[B] valid entries of each row, in the call's order: the absolute position of its next token."""
        return state.valid_lengths()[torch.tensor(slots, dtype=torch.long, device=state.mask.device)]

    def _presence(self, state: MaskedKVState, slots: list[int]) -> torch.Tensor:
        """[B, vocab] bool, in the call's order: the token ids each row holds."""
        index = torch.tensor(slots, dtype=torch.long, device=state.mask.device)
        return token_presence(state.tokens[index], state.mask[index], self.vocab)

    def _check_context(self, lengths: Mapping[str, int]) -> None:
        """`lengths`: tokens per row once the call is done."""
        limit = self.forward.context_length
        over = [r for r, n in lengths.items() if n > limit]
        if over:
            raise ContextLengthError(f"rows {over} would reach {max(lengths[r] for r in over)} tokens; model "
                                     f"{self.name!r} has a context of {limit}", over)

    def _check_tokens(self, tokens: Mapping[str, Sequence[int]]) -> None:
        """Every token id of every row in [0, vocab)."""
        bad = {r: t for r, ts in tokens.items() for t in ts if not 0 <= t < self.vocab}
        if bad:
            raise RowError(f"token ids {sorted(set(bad.values()))} of rows {list(bad)} are outside the vocabulary "
                           f"[0, {self.vocab}) of model {self.name!r}", list(bad))
