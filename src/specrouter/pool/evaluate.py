"""Figures for the model cards: held-out loss, top-1 accuracy, greedy agreement, decode latency."""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel


@dataclass(frozen=True)
class HeldoutScores:
    loss: float
    top1: float
    argmax: torch.Tensor  # [windows, seq] the model's greedy choice at every position


def heldout_windows(stream: torch.Tensor, count: int, seq_len: int) -> torch.Tensor:
    """`count` evenly spaced windows of `seq_len + 1` tokens: [count, seq_len + 1]."""
    stride = (stream.numel() - seq_len - 1) // count
    return torch.stack([stream[i * stride : i * stride + seq_len + 1] for i in range(count)]).long()


@torch.inference_mode()
def score_heldout(model: PreTrainedModel, windows: torch.Tensor, batch_size: int = 8) -> HeldoutScores:
    losses, hits, argmaxes = [], [], []
    for chunk in windows.split(batch_size):
        inputs, labels = chunk[:, :-1], chunk[:, 1:]
        logits = model(input_ids=inputs, use_cache=False).logits.float()  # [b, seq, vocab]
        losses.append(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none"))
        pred = logits.argmax(-1)
        hits.append((pred == labels).flatten())
        argmaxes.append(pred)
    return HeldoutScores(
        loss=torch.cat(losses).mean().item(),
        top1=torch.cat(hits).float().mean().item(),
        argmax=torch.cat(argmaxes),
    )


def greedy_agreement(model_scores: HeldoutScores, target_scores: HeldoutScores) -> float:
    """Fraction of held-out positions at which the model's argmax is the target's argmax."""
    return (model_scores.argmax == target_scores.argmax).float().mean().item()


@torch.inference_mode()
def decode_latency_ms(model: PreTrainedModel, batch_size: int, prompt_len: int = 32, steps: int = 32) -> float:
    """Median wall time of one single-token decode step with a KV cache, in milliseconds."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (batch_size, prompt_len), generator=gen)
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = {kwarg: DynamicCache()}
    out = model(input_ids=prompt, use_cache=True, **cache)
    token = out.logits[:, -1:].argmax(-1)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = model(input_ids=token, use_cache=True, **cache)
        token = out.logits[:, -1:].argmax(-1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[steps // 4 :]) * 1e3
