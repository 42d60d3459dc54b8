"""Stop strings as OpenAI's API returns them: the text ends before the stop string.

The router stops after a stop string and keeps it (and whatever else its last token held) in the output;
this cuts the text at the first stop string. A stream holds back the last characters that could begin a
stop string until the next chunk shows whether they do.
"""

from __future__ import annotations

from collections.abc import Sequence


def cut(text: str, stops: Sequence[str]) -> str:
    """`text` up to its first stop string (all of it if none occurs)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[:min(found)] if found else text


class StreamCutter:
    """Feeds a stream's text through `cut`: `feed` returns what can be sent now, `finish` the rest."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1   # no stop string fits in fewer characters
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.pending += text
        found = cut(self.pending, self.stops)
        if len(found) < len(self.pending):   # a stop string is complete: nothing after it is sent
            self.stopped, self.pending = True, ""
            return found
        ready = len(self.pending) - self.hold
        if ready <= 0:
            return ""
        out, self.pending = self.pending[:ready], self.pending[ready:]
        return out

    def finish(self) -> str:
        out, self.pending = ("" if self.stopped else cut(self.pending, self.stops)), ""
        self.stopped = True
        return out
