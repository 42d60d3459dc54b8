"""Stop strings: where a request's generated text first reaches one, and how many tokens to keep.

A stop string may end inside a token, or span several; the request keeps the fewest tokens whose text
reaches the end of the first stop string it completes, and drops the rest. Each cycle looks only at the
tail of the text that can hold a stop string not already seen, so a long generation costs no more a cycle
than a short one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Decode = Callable[[Sequence[int]], str]
# a byte-level tokenizer spells a character in at most 4 tokens (UTF-8), so a stop string of n characters
# spans at most 4n tokens
TOKENS_PER_CHARACTER = 4


class StopStrings:
    def __init__(self, strings: Sequence[str], decode: Decode):
        if any(not s for s in strings):
            raise ValueError("stop strings must not be empty")
        self.strings = tuple(strings)
        self.decode = decode
        self.span = TOKENS_PER_CHARACTER * max((len(s) for s in self.strings), default=0)

    def keep(self, generated: Sequence[int], new: int) -> int | None:
        """How many of `generated` to keep when one of the strings completes in the text of its last `new`
        tokens (None when none does): the text is cut after the end of the first string to complete. Tokens
        before the last `new` are always kept: they have been handed out."""
        if not self.strings or new <= 0:
            return None
        start = max(0, len(generated) - new - self.span)   # the tail that can hold a string ending in the new tokens
        tail = list(generated[start:])
        text = self.decode(tail)
        ends = [text.find(s) + len(s) for s in self.strings if s in text]
        if not ends:
            return None
        end = min(ends)
        for keep in range(len(tail) - new, len(tail) + 1):
            if len(self.decode(tail[:keep])) >= end:
                return start + keep
        return len(generated)
