"""The model-free level: prompt lookup, drafting by n-gram matching over each row's own tokens.

A chain may start with it (`lookup,29m`, `lookup,1m,29m`): it proposes the tokens that followed the most
recent earlier occurrence of the row's last n tokens (n from `max_ngram` down to `min_ngram`), up to the
window, in the prompt or in the output so far. Text that copies its input (code being edited, tables,
answers that quote their sources) gets long proposals for no forward pass at all. Where the row's own
tokens match no longer than a few tokens, the rows that ran before it in the router (`RecentRows`,
bounded) are searched too, for a longer match: requests that repeat one another (agents, templated
calls) copy each other's outputs. A row with no match proposes nothing, and its next level drafts or
verifies it as if the lookup were not there.

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
from collections.abc import Mapping, Sequence

import numpy as np

from specrouter.contract.calls import RowStep, StepResult, VerifyRow, WorkerInfo
from specrouter.contract.errors import StateError, UnknownStateError
from specrouter.router.row import Row

LOOKUP = "lookup"
MAX_NGRAM = 3
MIN_NGRAM = 1
NO_GUESS = -1   # no token id: where the lookup has no proposal, its guess agrees with no model's


SHADOW_WINDOW = 16        # positions of the lookup's proposal judged in cycles it does not run in
MATCH_MARK = "@"          # "lookup@3": the lookup's proposals after a match of 3 tokens, as a drafter of its own
RECENT_TOKENS = 1 << 16   # tokens of earlier rows the lookup keeps for all requests (about 15 MB)
RECENT_MIN_NGRAM = 3      # a match in another request's tokens must be at least this long


def longest_match(tokens: Sequence[int], window: int, max_ngram: int = MAX_NGRAM,
                  min_ngram: int = MIN_NGRAM) -> tuple[list[int], int]:
    """Up to `window` tokens that followed the most recent earlier occurrence of the last n tokens of
    `tokens`, for the longest n in [min_ngram, max_ngram] that occurs, and that n; ([], 0) if none does."""
    if window <= 0 or len(tokens) < min_ngram + 1:
        return [], 0
    seq = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        # candidate starts i with seq[i:i+n] == the last n tokens, and i + n < len(seq) (a token follows)
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)                       # [L - n, n]
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start:start + window].tolist(), n
    return [], 0


def prompt_guesses(tokens: Sequence[int], positions: int, max_ngram: int = MAX_NGRAM,
                   min_ngram: int = MIN_NGRAM) -> list[int]:
    """The lookup's first proposed token after each of the last `positions` prefixes of `tokens` (the
    prefix ending at each of those tokens), NO_GUESS where it proposes nothing: what a model's prefill
    returns as its argmax guesses, so that the scheduler compares the lookup with the models on a row's
    prompt as it compares two models. One pass, each n-gram's latest position kept as it goes."""
    positions = min(positions, len(tokens))
    if positions <= 0:
        return []
    latest: dict[tuple[int, ...], int] = {}   # n-gram -> position of the token after its latest occurrence
    guesses = []
    for end in range(len(tokens)):
        # the n-grams ending just before `end` have a token after them (tokens[end]) in this prefix
        for n in range(min_ngram, min(max_ngram, end) + 1):
            latest[tuple(tokens[end - n:end])] = end
        if end < len(tokens) - positions:
            continue
        guess = NO_GUESS
        for n in range(min(max_ngram, end), min_ngram - 1, -1):
            found = latest.get(tuple(tokens[end - n + 1:end + 1]))
            if found is not None:
                guess = tokens[found]
                break
        guesses.append(guess)
    return guesses


def by_match(level: str, n: int) -> str:
    """The name under which the scheduler measures `level`'s proposals made after a match of `n` tokens
    (0: no match, no proposal). How long a match the lookup found says much of how far its copy will
    hold: on held-out code, a proposal after a 3-token match has its first token accepted 84% of the
    time, after a 1-token match 37%. Measured apart, each match length prices the lookup's chains for the
    cycle about to run rather than for the average one."""
    return f"{level}{MATCH_MARK}{n}"


def level_of(drafter: str) -> str:
    """The level a drafter name stands for: `by_match`'s inverse ("lookup@3" -> "lookup"), any other
    name itself."""
    return drafter.split(MATCH_MARK, 1)[0]


def lookup_proposal(tokens: Sequence[int], window: int, max_ngram: int = MAX_NGRAM,
                    min_ngram: int = MIN_NGRAM) -> list[int]:
    """`longest_match`'s proposal alone."""
    return longest_match(tokens, window, max_ngram, min_ngram)[0]


def judged(proposal: Sequence[int], picks: Sequence[int], window: int) -> tuple[int, int]:
    """(accepted, positions checked) of `proposal` against `picks`, the tokens a verifier picked at the same
    positions of the same row (greedy or coupled: a proposed token is accepted iff it is the verifier's
    pick): accepted up to the first difference, checked up to and including it, within `window` and
    the positions `picks` judge. A proposal shorter than the window is rejected where it stops."""
    accepted = 0
    for x, y in zip(proposal[:window], picks):
        if x != y:
            break
        accepted += 1
    return accepted, min(accepted + 1, len(picks), window)


def shadow_checks(lookup: LookupProposer, rows: Sequence[Row], picks: Mapping[str, Sequence[Sequence[int]]],
                  ) -> dict[tuple[str, str], list[tuple[int, int] | None]]:
    """The lookup's acceptance, measured in a cycle that does not run it, for nothing but a match per row:
    what it would have proposed from the rows' tokens before the cycle, judged by each model of `picks`
    (the target's emitted tokens and, when a model drafted, that model's draft). Under greedy and coupled
    decoding a verifier accepts a proposed token iff it is its own pick, so these are the checks the pairs
    (lookup, model) would have made; the scheduler prices the lookup's chains from them without running the
    lookup's chains to learn how well it does on the text it serves now. None for a sampled row: its picks
    judge no point mass."""
    proposals = [lookup.row_match(r)[0] if r.sampling.greedy or r.sampling.coupled else None for r in rows]
    if all(p is None for p in proposals):
        return {}
    return {(lookup.name, judge): [None if p is None else judged(p, t, SHADOW_WINDOW)
                                   for p, t in zip(proposals, tokens)]
            for judge, tokens in picks.items()}


class RecentRows:
    """The token sequences of the rows that left the router most recently, at most `max_tokens` tokens in
    all (the oldest go first), indexed by every n-gram they hold for n in [min_ngram, max_ngram]: the n
    tokens -> where the latest sequence holding them continues. Memory is bounded by `max_tokens`: a
    sequence that goes takes its index entries with it (those that still point into it). Not thread-safe:
    its owner serializes the calls."""

    def __init__(self, max_tokens: int = RECENT_TOKENS, max_ngram: int = MAX_NGRAM,
                 min_ngram: int = RECENT_MIN_NGRAM):
        if max_tokens < 0 or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need max_tokens >= 0 and 1 <= min_ngram <= max_ngram, got {max_tokens}, "
                             f"{min_ngram} and {max_ngram}")
        self.max_tokens, self.max_ngram, self.min_ngram = max_tokens, max_ngram, min_ngram
        self._rows: dict[int, tuple[int, ...]] = {}   # sequence number -> its tokens, oldest first
        self._index: dict[tuple[int, ...], tuple[int, int]] = {}   # n-gram -> (sequence, position after it)
        self._next = 0
        self.tokens = 0

    def __len__(self) -> int:
        return len(self._rows)

    def index_size(self) -> int:
        return len(self._index)

    def add(self, tokens: Sequence[int]) -> None:
        """A row's tokens (prompt and output) join, and the oldest leave while over the bound."""
        tokens = tuple(tokens[-self.max_tokens:]) if self.max_tokens else ()
        if len(tokens) <= self.min_ngram:
            return
        number, self._next = self._next, self._next + 1
        self._rows[number] = tokens
        self.tokens += len(tokens)
        for n in range(self.min_ngram, self.max_ngram + 1):
            for i in range(len(tokens) - n):   # an n-gram with a token after it
                self._index[tokens[i:i + n]] = (number, i + n)
        while self.tokens > self.max_tokens:
            self._evict(next(iter(self._rows)))

    def _evict(self, number: int) -> None:
        tokens = self._rows.pop(number)
        self.tokens -= len(tokens)
        for n in range(self.min_ngram, self.max_ngram + 1):
            for i in range(len(tokens) - n):
                key = tokens[i:i + n]
                if self._index.get(key, (None,))[0] == number:
                    del self._index[key]

    def match(self, tokens: Sequence[int], window: int, longer_than: int = 0) -> tuple[list[int], int]:
        """Up to `window` tokens that followed the last n tokens of `tokens` in the latest sequence holding
        them, for the longest n > `longer_than` in [min_ngram, max_ngram], and that n; ([], 0) if none."""
        for n in range(min(self.max_ngram, len(tokens)), max(self.min_ngram, longer_than + 1) - 1, -1):
            found = self._index.get(tuple(tokens[-n:]))
            if found is not None:
                number, start = found
                return list(self._rows[number][start:start + window]), n
        return [], 0


class RowNgrams:
    """`longest_match` over a sequence that only grows, kept up to date as it grows: every n-gram (n in
    [min_ngram, max_ngram]) with a token after it -> the position after its latest occurrence. A router's
    row only gains tokens, so each cycle indexes the few it emitted and a match is a few dictionary reads,
    where `longest_match` scans the whole row (about 0.1 ms for 300 tokens, on the cycle's path)."""

    def __init__(self, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._latest: dict[tuple[int, ...], int] = {}
        self._indexed = 0          # the n-grams ending before this position are indexed
        self._tokens: list[int] = []

    def match(self, tokens: Sequence[int], window: int) -> tuple[list[int], int]:
        """`longest_match(tokens, window, max_ngram, min_ngram)`, where `tokens` extends the sequence of the
        last call (else the index starts over)."""
        tokens = list(tokens)
        if tokens[:len(self._tokens)] != self._tokens:   # not an extension (a C-speed compare)
            self._latest, self._indexed = {}, 0
        self._tokens = tokens
        latest, low, high = self._latest, self.min_ngram, self.max_ngram
        for end in range(self._indexed, len(tokens) - 1):   # an n-gram ending at `end` has a token after it
            for n in range(low, min(high, end + 1) + 1):
                latest[tuple(tokens[end - n + 1:end + 1])] = end + 1
        self._indexed = max(self._indexed, len(tokens) - 1)
        if window <= 0 or len(tokens) < low + 1:
            return [], 0
        for n in range(min(high, len(tokens) - 1), low - 1, -1):
            start = latest.get(tuple(tokens[len(tokens) - n:]))
            if start is not None:
                return list(tokens[start:start + window]), n
        return [], 0


class LookupProposer:
    """The lookup level as a worker of the pool (see the module's docstring). Thread-safe: batches of
    different chains call it from the batcher's thread and the fan-out pool alike."""

    remote = False

    def __init__(self, name: str = LOOKUP, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM,
                 recent_tokens: int = RECENT_TOKENS):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.name = name
        self.address = f"in-process:{name}"
        # no model: no parameters, and neither a vocabulary nor a context of its own (it proposes the rows'
        # own tokens, within the room the chain gives it)
        self.info = WorkerInfo(model_name=name, parameters=0, vocab_size=0, context_length=0)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.recent = RecentRows(recent_tokens, max_ngram, min(max_ngram, RECENT_MIN_NGRAM))
        self._states: dict[str, dict[str, list[int]]] = {}   # state id -> row id -> tokens fed so far
        self._ngrams: dict[str, dict[str, RowNgrams]] = {}   # state id -> row id -> its tokens' n-grams
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
        guesses = [prompt_guesses(tokens, predictions, self.max_ngram, self.min_ngram) for _, tokens in rows]
        return StepResult(tokens=guesses, rows=[None] * len(rows))

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
            ngrams = self._ngrams.setdefault(state_id, {})
            for r in rows:
                if r.row_id not in ngrams:
                    ngrams[r.row_id] = self._index()
            proposals = [self._match(tokens, window, ngrams[r.row_id])[0] for r, tokens in zip(rows, histories)]
            for tokens, proposal in zip(histories, proposals):   # cached as a model caches its draft: all but
                tokens.extend(proposal[:-1])                      # the last token, which it never fed
        return StepResult(tokens=proposals, rows=[None] * len(rows))

    def propose(self, tokens: Sequence[int], window: int) -> list[int]:
        """What the lookup proposes after `tokens`, without touching any state."""
        return self.match(tokens, window)[0]

    def match(self, tokens: Sequence[int], window: int) -> tuple[list[int], int]:
        """What the lookup proposes after `tokens` and the length of the match it copies from (0: none),
        without touching any state."""
        with self._lock:
            return self._match(tokens, window)

    def row_match(self, row: Row) -> tuple[list[int], int]:
        """`match` of the row's tokens as they stand, up to SHADOW_WINDOW tokens, computed once per length
        of the row, over an index of the row's n-grams that grows with it (`RowNgrams`): the scheduler
        prices the row's next cycle by it, and the cycle's measurements file the lookup's checks under it."""
        memo = row.lookup_match
        if memo is None or memo[0] != len(row.tokens):
            if row.lookup_ngrams is None:
                row.lookup_ngrams = self._index()
            with self._lock:
                proposal, n = self._match(row.tokens, SHADOW_WINDOW, row.lookup_ngrams)
            memo = row.lookup_match = (len(row.tokens), proposal, n)
        return memo[1], memo[2]

    def _index(self) -> RowNgrams:
        return RowNgrams(self.max_ngram, self.min_ngram)

    def _match(self, tokens: Sequence[int], window: int, ngrams: RowNgrams | None = None) -> tuple[list[int], int]:
        """The row's own longest match (from `ngrams`, the row's index, where given), or a longer one in the
        rows that ran before it."""
        proposal, n = (longest_match(tokens, window, self.max_ngram, self.min_ngram) if ngrams is None
                       else ngrams.match(tokens, window))
        if n < self.max_ngram:
            elsewhere, m = self.recent.match(tokens, window, longer_than=n)
            if m > n:
                return elsewhere, m
        return proposal, n

    def verify(self, state_id: str, level: int, rows: Sequence[VerifyRow], hand_up: bool) -> StepResult:
        raise ValueError(f"{self.name!r} drafts only: it can start a chain, never verify")

    def probe(self, timeout_s: float = 2.0) -> None:
        """The lookup runs in the router's process: it always answers."""

    def close(self) -> None:
        """Nothing to let go of: the router owns the lookup for as long as it runs."""

    def release(self, state_id: str, row_ids: Sequence[str] | None = None) -> None:
        """The rows leave; their tokens join `recent` (a row released to be rebuilt joins it too: a
        hint only, like every proposal)."""
        with self._lock:
            state = self._states.get(state_id)
            if state is None:
                return
            ngrams = self._ngrams.get(state_id, {})
            for row_id in list(state) if row_ids is None else row_ids:
                tokens = state.pop(row_id, None)
                ngrams.pop(row_id, None)
                if tokens is not None:
                    self.recent.add(tokens)
            if not state:
                del self._states[state_id]
                self._ngrams.pop(state_id, None)
