"""Pretraining of the target and distillation of the smaller models from it.

Every batch is drawn by a seeded generator, so a run is reproducible on the same machine.
Distillation minimises KL(target || student) over every position, which raises the greedy
agreement of a small model with the target well above training it on the data alone.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainPlan:
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)


@dataclass(frozen=True)
class TrainResult:
    steps: int
    tokens: int
    seconds: float
    final_loss: float


def random_windows(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """`batch` windows of `seq_len + 1` tokens from the 1-D token stream: [batch, seq_len + 1]."""
    starts = torch.randint(0, stream.numel() - seq_len - 1, (batch,), generator=gen)
    return torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()]).long()


def _optimizer(model: torch.nn.Module, plan: TrainPlan) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": plan.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=plan.lr, betas=(0.9, 0.95), fused=False)


def train(
    model: LlamaForCausalLM,
    stream: torch.Tensor,
    plan: TrainPlan,
    teacher: LlamaForCausalLM | None = None,
    progress=None,
    autocast_dtype: torch.dtype | None = None,
) -> TrainResult:
    """Train `model` on next-token prediction, or on the teacher's distributions when one is given."""
    torch.manual_seed(plan.seed)
    gen = torch.Generator().manual_seed(plan.seed)
    opt = _optimizer(model, plan)
    model.train()
    if teacher is not None:
        teacher.eval()
    start = time.perf_counter()
    loss_ema = None
    for step in range(plan.steps):
        for group in opt.param_groups:
            group["lr"] = plan.lr_at(step)
        batch = random_windows(stream, plan.batch_size, plan.seq_len, gen)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        with torch.autocast(inputs.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(input_ids=inputs, use_cache=False).logits.float()  # [batch, seq, vocab]
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(input_ids=inputs, use_cache=False).logits.float()
        if teacher is None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        else:
            teacher_logp = F.log_softmax(teacher_logits, dim=-1)
            loss = F.kl_div(
                F.log_softmax(logits, dim=-1).flatten(0, 1),
                teacher_logp.flatten(0, 1),
                log_target=True,
                reduction="batchmean",
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        if progress is not None:
            progress(step + 1, plan.steps, loss_ema)
    model.eval()
    seconds = time.perf_counter() - start
    return TrainResult(plan.steps, plan.steps * plan.batch_size * plan.seq_len, seconds, loss_ema or float("nan"))
