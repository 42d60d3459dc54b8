"""The router's own costs, learned from each cycle's wall times and added to every prediction: one round
trip and the router's work per call to a level, and its work between calls per cycle."""

from __future__ import annotations

import math
from collections import defaultdict

from specrouter.router.scheduling.ema import Ema, power_of_two


class CallOverheads:
    """Per (model, batch size rounded up to a power of two, passes in the call): an EMA of the call's wall
    time beyond its passes."""

    def __init__(self, alpha: float):
        self._by_key: dict[tuple[str, int, int], Ema] = defaultdict(lambda: Ema(alpha))

    def observe(self, model: str, batch_size: int, passes: int, overhead_ns: float) -> None:
        self._by_key[(model, power_of_two(batch_size), passes)].add(overhead_ns)

    def value(self, batch_size: int) -> dict[tuple[str, int], float]:
        """Per (model, passes), the call overheads measured at the batch size (rounded up to a power of
        two: a wave's tail passes through every size below the full one, each seen a few times); for a
        model with none there, those of the nearest size it was measured at (on a log scale). A call's work
        beyond its passes (messages, sampling, the worker's bookkeeping) grows with its rows, and a wave's
        batch shrinks as rows finish: one EMA over every size would price a full batch at its tail's rows."""
        b = power_of_two(batch_size)
        sizes: dict[str, dict[int, dict[int, float]]] = defaultdict(dict)
        for (model, size, passes), e in self._by_key.items():
            if e.weight > 0:
                sizes[model].setdefault(size, {})[passes] = e.get()
        known = {}
        for model, by_size in sizes.items():
            near = min(by_size, key=lambda size: (abs(math.log(size / b)), size))
            known.update({(model, passes): value for passes, value in by_size[near].items()})
        return known


class CycleOverheads:
    """Per batch size: an EMA of a cycle's wall time beyond its calls."""

    def __init__(self, alpha: float):
        self._by_batch: dict[int, Ema] = defaultdict(lambda: Ema(alpha))

    def observe(self, batch_size: int, overhead_ns: float) -> None:
        self._by_batch[batch_size].add(overhead_ns)

    def value(self, batch_size: int) -> float:
        """The EMA at the batch size, else at the nearest size measured, else 0."""
        known = self._by_batch.get(batch_size)
        if known is not None and known.weight > 0:
            return known.get()
        near = [(abs(b - batch_size), e.get()) for b, e in self._by_batch.items() if e.weight > 0]
        return min(near)[1] if near else 0.0
