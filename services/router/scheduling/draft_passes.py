"""What a drafter's passes after its first cost when it drafts for one row, against one pass a token.

A worker drafting for a single row feeds guesses from the row's own history with each drafted token and
keeps those it agrees with (the worker's `lookahead`), so the W - 1 passes after its first cost less than
W - 1 single-token passes of the latency table, by how much depending on how often the text repeats
itself. Each batch-1 draft measures that ratio; `cycle_cost.predict` multiplies the drafter's later
passes by it, so that the scheduler sees longer windows as cheap as they are. A drafter that does not
look ahead measures about 1.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from specrouter.router.scheduling.ema import Ema


class DraftPasses:
    """Per (drafter, window): an EMA of a batch-1 draft's passes after the first, in single-token passes."""

    def __init__(self, alpha: float):
        self._by_key: dict[tuple[str, int], Ema] = defaultdict(lambda: Ema(alpha))

    def observe(self, drafter: str, window: int, later_ns: float, single_pass_ns: float) -> None:
        """One draft of `window` tokens for one row whose passes after the first took `later_ns`, where the
        latency table prices a single-token pass at `single_pass_ns`."""
        if window > 1 and single_pass_ns > 0:
            self._by_key[(drafter, window)].add(later_ns / ((window - 1) * single_pass_ns))

    def value(self) -> dict[tuple[str, int], float]:
        return {key: e.get() for key, e in self._by_key.items() if e.weight > 0}


def draft_scale(known: Mapping[tuple[str, int], float], drafter: str, window: int) -> float:
    """The measured scale at the window, else at the drafter's nearest measured window (the shorter on a
    tie), else 1."""
    if (drafter, window) in known:
        return known[(drafter, window)]
    windows = [w for d, w in known if d == drafter]
    if not windows:
        return 1.0
    return known[(drafter, min(windows, key=lambda w: (abs(w - window), w)))]
