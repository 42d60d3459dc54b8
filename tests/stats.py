"""A chi-square goodness-of-fit test, for tests whose assertion is statistical."""

from __future__ import annotations

import torch

MIN_EXPECTED = 5.0  # cells expected to hold fewer samples are pooled into one


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of observing `counts` [cells] under `probs` [cells] (Pearson's chi-square)."""
    counts = counts.double().flatten()
    n = counts.sum()
    expected = probs.double().flatten() * n
    small = expected < MIN_EXPECTED
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    if bool((counts[~keep] > 0).any()):
        return 0.0  # an outcome of probability zero occurred
    counts, expected = counts[keep], expected[keep]
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.double), stat / 2))
