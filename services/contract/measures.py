"""The keys the profiler's figures are kept under, which the router's scheduler reads them by.

A figure is kept per decoding mode (acceptance differs between greedy, speculative and coupled sampling),
and per bucket of batch size and tokens per row (latency). `EmaConstants` says how far one report moves a
figure: the scheduler's own estimates follow the profiler's at the same rates.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Mode(enum.Enum):
    GREEDY = "greedy"
    SAMPLING = "sampling"   # speculative sampling, the rows each token was drawn from handed up
    COUPLED = "coupled"     # coupled sampling: picks under shared noise, checked by equality


# Batch size and tokens per row are kept exactly up to 16 (windows of 1 to 8 verify 2 to 9 tokens, and 3
# tokens cost measurably less than 4 on a CPU), beyond that per power-of-two bucket (17..32 -> 32): a
# forward pass costs about the same across a large bucket, and the number of keys stays logarithmic.
EXACT_UP_TO = 16


def bucket(n: int) -> int:
    """The bucket of n >= 1: n itself up to EXACT_UP_TO, else the smallest power of two >= n."""
    return n if n <= EXACT_UP_TO else 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class EmaConstants:
    """How far one update moves a record: `ema_alpha` per report, `acceptance_alpha` per check."""

    ema_alpha: float = 0.1
    acceptance_alpha: float = 0.01
