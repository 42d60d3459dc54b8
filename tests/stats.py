"""A chi-square goodness-of-fit test, for tests whose assertion is statistical, and the exact distribution
of a model's next tokens to test against."""

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


def exact_joint(model, params, prompt: list[int], tokens: int) -> torch.Tensor:
    """P(t1, ..., tn | prompt) of a causal LM's next `tokens` tokens under the request's logits processors
    (`params`, a SamplingParams): [V] * tokens, from one forward pass per prefix."""
    from specrouter.worker.sampling import BatchSampling, next_token_probs, token_presence

    s = BatchSampling([params], torch.device("cpu"))

    def probs(prefix: list[int]) -> torch.Tensor:
        history = torch.tensor([prefix])
        logits = model(input_ids=history).logits[0, -1:].float()
        vocab = logits.shape[-1]
        return next_token_probs(logits, s, token_presence(history, torch.ones_like(history, dtype=torch.bool), vocab))[0]

    def joint(prefix: list[int], left: int) -> torch.Tensor:
        p = probs(prefix)
        if left == 1:
            return p
        return torch.stack([p[t] * joint([*prefix, t], left - 1) for t in range(p.numel())])

    with torch.inference_mode():
        return joint(list(prompt), tokens)
