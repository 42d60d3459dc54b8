"""An exponential moving average from a zero start, debiased by the EMA of a constant 1 (its `weight`), so
that the first sample counts at face value; the building block of the scheduler's learned corrections."""

from __future__ import annotations


class Ema:
    __slots__ = ("alpha", "value", "weight", "count")

    def __init__(self, alpha: float):
        self.alpha, self.value, self.weight, self.count = alpha, 0.0, 0.0, 0

    def add(self, x: float) -> None:
        self.value = (1 - self.alpha) * self.value + self.alpha * x
        self.weight = (1 - self.alpha) * self.weight + self.alpha
        self.count += 1

    def fade(self, towards: float, rate: float) -> None:
        """Moves the estimate `rate` of the way to `towards` (no sample, so the count stays)."""
        if self.weight > 0:
            self.value = (self.get() + rate * (towards - self.get())) * self.weight

    def forget(self, keep: float) -> None:
        """Keeps `keep` of the weight of the samples so far (the estimate stays), so that the next samples
        count for more: for a measure about to be taken again after it went stale."""
        self.value *= keep
        self.weight *= keep

    def get(self, default: float = 0.0) -> float:
        return self.value / self.weight if self.weight > 0 else default


def power_of_two(n: int) -> int:
    """n rounded up to a power of two."""
    return 1 << max(0, n - 1).bit_length()
