"""Guesses of a row's next tokens from its own history, so a drafter checks several drafts per forward pass.

A drafter drafts autoregressively: one forward pass per token, and a small model's pass costs about the
same for one token as for several (its time is mostly fixed per pass, not per token). So the drafter
guesses what follows from the row's own tokens (the tokens that followed the latest earlier occurrence of
its last few tokens: prompt lookup, as in Saxena's prompt lookup decoding), feeds the guesses with the
token it just drafted, and keeps those its own choice agrees with. What it drafts is exactly what it
would have drafted one pass at a time (each kept token is the one it chooses at that position, from the
distribution it would have had there); only the number of passes changes. Code and text that repeat
themselves (tables, runs of similar statements, identifiers) are where guesses come true.
"""

from __future__ import annotations

import numpy as np

SHORTEST_MATCH = 2  # a guess follows an earlier occurrence of at least the last two tokens...
LONGEST_MATCH = 3   # ...and of the longest suffix found, up to three


def guess(context: np.ndarray, limit: int, shortest: int = SHORTEST_MATCH, longest: int = LONGEST_MATCH) -> list[int]:
    """Up to `limit` tokens that followed the latest earlier occurrence of the longest suffix of `context`
    (1-D token ids) found earlier in it, at most `longest` tokens long; [] when no suffix of `shortest`
    tokens occurred before. A single token recurs often with something else after it: on code, guesses
    after a one-token match are mostly wrong, and a wrong guess still costs its share of the pass."""
    n = len(context)
    if limit < 1 or n < 2:
        return []
    ends = np.flatnonzero(context[:-1] == context[-1])          # earlier positions holding the last token
    if len(ends) == 0:
        return []
    best, matched = ends, 1
    for back in range(1, longest):
        if n - 1 - back < 0:
            break
        longer = best[best >= back]
        longer = longer[context[longer - back] == context[n - 1 - back]]
        if len(longer) == 0:
            break
        best, matched = longer, matched + 1
    if matched < shortest:
        return []
    start = int(best[-1]) + 1
    return context[start:start + limit].tolist()
