"""Metrics held in this process: the local embedded default, where one profiler serves every router."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from specrouter.profiler.metrics import Ema, FAMILIES, Records, Update
from specrouter.contract.measures import EmaConstants


class MemoryStore:
    """A dict of EMA records behind a lock; lost when the process ends, never unavailable."""

    def __init__(self, ema_alpha: float, acceptance_alpha: float = EmaConstants.acceptance_alpha):
        self.constants = EmaConstants(ema_alpha, acceptance_alpha)
        self._records: dict[str, dict[str, Ema]] = {family: {} for family in FAMILIES}
        self._lock = threading.Lock()

    def apply(self, updates: Sequence[Update]) -> None:
        with self._lock:
            for u in updates:
                table = self._records[u.family]
                table[u.field] = table.get(u.field, Ema.zero(len(u.x))).updated(u.x, *u.weights(self.constants))

    def records(self) -> Records:
        with self._lock:
            return {family: dict(table) for family, table in self._records.items()}

    def close(self) -> None:
        pass
