"""The scheduler report's done-when checks, judged on its runs and its acceptance records.

A run's run-off figures, where it has one, stand for it: the run-off measures the screening's picks
afresh, so the luck that made them the fastest of many is not counted twice. A check with nothing to judge
(no switching run, say) is None: not run, neither passed nor failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from specrouter.report.scheduler_results import Acceptance, RunOutcome, is_switching

T = TypeVar("T")

BEST_STATIC_SHARE_MIN = 0.95      # adaptive's tokens/s over the best static's, at least
TARGET_ONLY_SHARE_MIN = 0.97      # adaptive's tokens/s over target-only's, at least
ACCEPTANCE_TOLERANCE = 0.05       # predicted against realized acceptance of a pair in use, at most apart


def checks(runs: Sequence[RunOutcome], acceptance: Sequence[Acceptance]) -> dict[str, bool | None]:
    """Each check by name: True (passed), False (failed) or None (nothing to judge)."""
    plain = [r.decided for r in runs if not is_switching(r.kind)]
    switching = [r.decided for r in runs if is_switching(r.kind)]
    in_use = [a for a in acceptance if a.in_use and a.predicted is not None]
    return {
        "adaptive_within_5pct_of_best_static": _judged(
            plain, lambda s: s.adaptive_over_best_static >= BEST_STATIC_SHARE_MIN),
        "adaptive_at_most_3pct_slower_than_target_only": _judged(
            plain, lambda s: s.adaptive_over_target_only >= TARGET_ONLY_SHARE_MIN),
        "switching_adaptive_beats_every_static": _judged(switching, lambda s: s.adaptive_beats_every_static),
        "acceptance_within_0.05": _judged(
            in_use, lambda a: abs(a.predicted - a.realized) <= ACCEPTANCE_TOLERANCE),
    }


def _judged(items: Sequence[T], ok: Callable[[T], bool]) -> bool | None:
    return all(ok(x) for x in items) if items else None
