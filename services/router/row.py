"""One request's row in a running batch: its tokens, where each model's cache of them stands, how it ends.

The router's rows are the truth of a batch: every worker's state of a row is rebuilt from `tokens` when it
no longer matches them, and `seen` and `spec` say what each model's next call must roll back and feed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specrouter.contract.calls import SamplingParams
from specrouter.router.stops import StopStrings

FINISH_STOP = "stop"      # EOS or a stop sequence
FINISH_LENGTH = "length"  # max_new_tokens or the context


@dataclass
class Row:
    """One request in the running batch."""

    row_id: str
    tokens: list[int]               # prompt + emitted
    prompt_len: int
    sampling: SamplingParams
    max_new_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: StopStrings | None = None
    cycle: int = 0
    finish_reason: str | None = None
    seen: dict[str, int] = field(default_factory=dict)      # per model: tokens of `tokens` in its valid cache
    spec: dict[str, list[int]] = field(default_factory=dict)  # per model: speculative tokens in its cache
    # per pair of models (both orders): (positions of the prompt where their argmax next tokens agree,
    # positions compared), from the prefill; how alike two models find this row before either drafts it
    prompt_agreement: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    # the lookup level's proposal after `tokens` and the length of its match, as (len(tokens) then,
    # proposal, match length): LookupProposer.row_match
    lookup_match: tuple[int, list[int], int] | None = None
    lookup_ngrams: object | None = None   # lookup.RowNgrams over `tokens`, for the above

    def __post_init__(self) -> None:
        self.tokens = list(self.tokens)  # the row grows its own copy, never the caller's prompt

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def step_for(self, model: str) -> tuple[int, list[int]]:
        """(rollback, pending) for the model's next call."""
        return len(self.spec.get(model, ())), self.tokens[self.seen[model] :]

    def emit(self, tokens: Sequence[int], context_length: int) -> list[int]:
        """Appends the target's tokens up to the first stop, and returns those it keeps. A stop string is
        looked for whatever else ended the row in this cycle, and wins: the row's text is the same whether
        the string completes in a cycle of its own or in the one that reaches max_new_tokens."""
        out = []
        for t in tokens:
            self.tokens.append(t)
            out.append(t)
            if t in self.stop_token_ids:
                self.finish_reason = FINISH_STOP
            elif len(self.generated) >= self.max_new_tokens or len(self.tokens) >= context_length - 1:
                self.finish_reason = FINISH_LENGTH
            if self.finish_reason:
                break
        keep = self.stop_strings.keep(self.generated, len(out)) if self.stop_strings is not None else None
        if keep is not None:
            drop = len(self.generated) - keep
            del self.tokens[len(self.tokens) - drop:]
            del out[len(out) - drop:]
            self.finish_reason = FINISH_STOP
        return out



def prompt_agreement(guesses: Mapping[str, Sequence[int]]) -> dict[tuple[str, str], tuple[int, int]]:
    """For every two models, in both orders: (positions where their guesses agree, positions compared),
    over the last positions both guessed at."""
    out = {}
    for a, b in itertools.combinations(sorted(guesses), 2):
        n = min(len(guesses[a]), len(guesses[b]))
        if n:
            same = sum(x == y for x, y in zip(guesses[a][-n:], guesses[b][-n:]))
            out[(a, b)] = out[(b, a)] = (same, n)
    return out
