"""What a user would run instead of SpecRouter: the pool's models with transformers, in one process.

Three peers, all greedy, on the token ids the router would decode (the pool tokenizer without special
tokens, as `RequestParser.parse` encodes a prompt) and stopping as the router stops (at the
tokenizer's EOS, which is kept, or after `max_new_tokens`, or where the context runs out):

- `generate_target`: target-only `model.generate`, one prompt at a time;
- `generate_assisted`: transformers' assisted generation with a drafter as `assistant_model=` (batch 1
  only, as transformers supports it), at transformers' own defaults for the assistant (the draft length
  and the confidence threshold a user gets without tuning);
- `generate_prompt_lookup`: transformers' prompt lookup (`prompt_lookup_num_tokens=10`, as its
  documentation suggests; no draft model), batch 1;
- `generate_batched`: target-only `model.generate` over a batch, left padded, with an attention mask;
  a row that finished early is padded to the batch's end, and its tokens after EOS are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specrouter.pool.load import PoolDir, load_model, load_tokenizer, parse_dtype


@dataclass
class PeerModels:
    """The pool's models and tokenizer, loaded with transformers in this process, on the device and in the
    dtype the services' workers use, so that both sides compute alike."""

    tokenizer: PreTrainedTokenizerBase
    models: dict[str, PreTrainedModel]
    target: str
    device: str = "cpu"

    @classmethod
    def load(cls, pool_dir: Path, device: str = "cpu", dtype: str = "float32") -> PeerModels:
        pool = PoolDir.open(pool_dir)
        models = {name: load_model(pool.model_dir(name), parse_dtype(dtype), device) for name in pool.names}
        return cls(load_tokenizer(pool.model_dir(pool.target)), models, pool.target, device)

    def parameters(self, name: str) -> int:
        return sum(p.numel() for p in self.models[name].parameters())

    def drafters(self) -> list[str]:
        """Every model but the target, smallest first."""
        return sorted((n for n in self.models if n != self.target), key=self.parameters)

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        """The prompt's ids exactly as the router makes them: no BOS, no special tokens."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def context_length(self) -> int:
        """The shortest context of the pool, as the router's (`ChainBatch.context_length`)."""
        return min(m.config.max_position_embeddings for m in self.models.values())


def room(prompt_len: int, max_new_tokens: int, context_length: int) -> int:
    """New tokens the router would emit at most: it stops a row once it holds `context_length - 1` tokens."""
    return max(0, min(max_new_tokens, context_length - 1 - prompt_len))


def trim_at_eos(ids: Sequence[int], eos: int | None, limit: int) -> list[int]:
    """`ids` up to and including the first EOS, at most `limit` of them: what the router emits."""
    out = list(ids[:limit])
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]
    return out


def _greedy(max_new_tokens: int, eos: int | None) -> dict:
    pad = 0 if eos is None else eos
    return dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, eos_token_id=eos, pad_token_id=pad)


def generate_target(peers: PeerModels, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Target-only greedy `generate` of one prompt: its new token ids."""
    return _generate_one(peers, prompt_ids, max_new_tokens, assistant=None)


def generate_assisted(peers: PeerModels, drafter: str, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy assisted generation, `drafter` as the assistant of the target: its new token ids."""
    return _generate_one(peers, prompt_ids, max_new_tokens, assistant=peers.models[drafter])


PROMPT_LOOKUP_TOKENS = 10


def generate_prompt_lookup(peers: PeerModels, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """Greedy generation with transformers' prompt lookup: its new token ids."""
    return _generate_one(peers, prompt_ids, max_new_tokens, assistant=None,
                         extra={"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS})


def _generate_one(peers: PeerModels, prompt_ids: Sequence[int], max_new_tokens: int,
                  assistant: PreTrainedModel | None, extra: dict | None = None) -> list[int]:
    limit = room(len(prompt_ids), max_new_tokens, peers.context_length())
    if limit == 0:
        return []
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=peers.device)   # [1, prompt]
    extra = dict(extra or {}) | ({} if assistant is None else {"assistant_model": assistant})
    with torch.inference_mode():
        out = peers.models[peers.target].generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                                  **_greedy(limit, peers.eos_token_id), **extra)
    return trim_at_eos(out[0, ids.shape[1]:].tolist(), peers.eos_token_id, limit)


def left_pad(prompts: Sequence[Sequence[int]], pad: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left padded to the longest: (input ids, attention mask), each [batch, longest] on `device`."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), longest), dtype=torch.long)
    for row, p in enumerate(prompts):
        if p:
            ids[row, longest - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[row, longest - len(p):] = 1
    return ids.to(device), mask.to(device)


def generate_batched(peers: PeerModels, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """Target-only greedy `generate` of a batch (left padding, attention mask): each row's new token ids."""
    eos = peers.eos_token_id
    limits = [room(len(p), max_new_tokens, peers.context_length()) for p in prompts]
    if max(limits) == 0:
        return [[] for _ in prompts]
    ids, mask = left_pad(prompts, 0 if eos is None else eos, peers.device)
    with torch.inference_mode():
        out = peers.models[peers.target].generate(input_ids=ids, attention_mask=mask, **_greedy(max(limits), eos))
    new = out[:, ids.shape[1]:].tolist()   # [batch, generated]
    return [trim_at_eos(row, eos, limit) for row, limit in zip(new, limits)]
