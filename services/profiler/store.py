"""Where the profiler keeps its EMA records: the interface, and the choice made from the settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specrouter.profiler.memory_store import MemoryStore
from specrouter.contract.measures import EmaConstants
from specrouter.profiler.metrics import Records, Update
from specrouter.profiler.redis_store import RedisStore
from specrouter.profiler.settings import ProfilerSettings


class MetricStore(Protocol):
    constants: EmaConstants   # how far one report moves a record

    def apply(self, updates: Sequence[Update]) -> None:
        """Applies all updates as one step that no concurrent writer can split; raises StoreUnavailable."""

    def records(self) -> Records:
        """Every record, read at one point in time; raises StoreUnavailable."""

    def close(self) -> None: ...


def open_store(settings: ProfilerSettings) -> MetricStore:
    """Redis when `redis_url` is set, else in memory (one profiler for every router)."""
    if settings.redis_url is None:
        return MemoryStore(settings.ema_alpha, settings.acceptance_alpha)
    return RedisStore.from_url(settings.redis_url, settings.ema_alpha, settings.key_prefix, settings.redis_timeout_s,
                               settings.acceptance_alpha)
