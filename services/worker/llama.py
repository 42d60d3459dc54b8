"""A Llama-family forward pass over the masked state, without transformers' module machinery.

A small model's forward pass on a CPU is mostly Python: module calls with their hooks, keyword
plumbing, output records and the mask preparation can cost more than its matrix products. This runs
the same tensor operations in the same order on the model's own weights (embedding, per layer RMSNorm, q/k/v
projections, rotary embedding, scaled dot-product attention under the caller's 4-D mask, output
projection, RMSNorm, SwiGLU MLP; final norm and LM head), so its logits are those of the model's `sdpa`
attention given the same mask: bit for bit when every projection runs through PyTorch, to rounding when
the large ones run prepacked for oneDNN on the CPU (`_Linear`, the default). Models it does not cover run
through transformers (`supports`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


def supports(model: PreTrainedModel) -> bool:
    """Whether `LlamaForward` computes exactly what this model's own forward pass computes."""
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or {}
    return (
        cfg.model_type == "llama"
        and getattr(cfg, "_attn_implementation", None) == "sdpa"
        and cfg.hidden_act == "silu"
        and getattr(cfg, "pretraining_tp", 1) == 1
        and rope.get("rope_type", "default") == "default"
    )


PREPACK_MIN_ELEMENTS = 1 << 18   # weights this large (1 MiB in fp32) are prepacked for oneDNN on the CPU


@dataclass(frozen=True)
class _Linear:
    """A projection's weight [out, in] and bias, and, on the CPU, the weight in oneDNN's blocked layout.

    PyTorch's CPU matrix product packs the weight into its blocked layout on every call that multiplies
    more than one row, which for a small model costs more than the arithmetic: prepacked once, a
    projection of one to a few dozen rows takes half the time or less (on two cores, a 512 x 1536
    projection of 6 rows 69 us against 167). The results differ from PyTorch's by rounding (a relative
    1e-6), as a block of k tokens already differs from k single-token passes. Small weights stay with
    PyTorch: oneDNN's fixed cost per call is larger than what packing costs them. So does every weight
    where this PyTorch cannot prepack (no oneDNN, another dtype or device, or the packing op refuses it)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    packed: torch.Tensor | None

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None, prepack_min: int | None) -> _Linear:
        packed = None
        if (prepack_min is not None and weight.numel() >= prepack_min and weight.device.type == "cpu"
                and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()):
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            except (AttributeError, RuntimeError):   # a build without the op, or one that refuses the weight
                packed = None
        return cls(weight, bias, packed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


@dataclass(frozen=True)
class _Layer:
    attn_norm: torch.Tensor
    attn_eps: float
    q: _Linear
    k: _Linear
    v: _Linear
    o: _Linear
    mlp_norm: torch.Tensor
    mlp_eps: float
    gate: _Linear
    up: _Linear
    down: _Linear


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaForward:
    """Holds references to a Llama model's weights (no copies); call it like the model, with a list of
    per-layer caches that have `update(keys, values) -> (all keys, all values)`."""

    def __init__(self, model: PreTrainedModel, prepack_min: int | None = PREPACK_MIN_ELEMENTS):
        """`prepack_min`: weights of at least this many elements run through oneDNN prepacked (`_Linear`);
        None: every projection through PyTorch, whose logits equal the model's own bit for bit."""
        if not supports(model):
            raise ValueError(f"{type(model).__name__} ({model.config.model_type}) is not a plain Llama with sdpa attention")
        base = model.model
        self.embed = base.embed_tokens.weight
        linear = lambda module: _Linear.of(module.weight, module.bias, prepack_min)  # noqa: E731
        self.layers = []
        for layer in base.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                linear(a.q_proj), linear(a.k_proj), linear(a.v_proj), linear(a.o_proj),
                layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                linear(m.gate_proj), linear(m.up_proj), linear(m.down_proj)))
        first = base.layers[0].self_attn
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self.groups = first.num_key_value_groups
        self.norm, self.norm_eps = base.norm.weight, base.norm.variance_epsilon
        self.lm_head = _Linear.of(model.lm_head.weight, getattr(model.lm_head, "bias", None), prepack_min)
        self.inv_freq = base.rotary_emb.inv_freq
        self.rope_scaling = base.rotary_emb.attention_scaling

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
                 caches: Sequence, logits_at: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, position_ids [B, k]; mask [B, 1, k, L + k] additive; returns logits [B, k, vocab], or
        [B, n, vocab] at the block's columns `logits_at` [B, n] (the output head runs on those alone)."""
        b, k = input_ids.shape
        x = F.embedding(input_ids, self.embed)                                      # [B, k, hidden]
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scaling).to(x.dtype).unsqueeze(1)              # [B, 1, k, head_dim]
        sin = (emb.sin() * self.rope_scaling).to(x.dtype).unsqueeze(1)
        shape = (b, k, -1, self.head_dim)
        for w, cache in zip(self.layers, caches):
            h = _rms_norm(x, w.attn_norm, w.attn_eps)
            q = w.q(h).view(shape).transpose(1, 2)                                 # [B, H, k, D]
            key = w.k(h).view(shape).transpose(1, 2)                               # [B, Hkv, k, D]
            value = w.v(h).view(shape).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            key = (key * cos) + (_rotate_half(key) * sin)
            key, value = cache.update(key, value)                                   # [B, Hkv, L + k, D]
            if self.groups > 1 and k == 1:   # one query: each kv head's query heads as its query rows
                q = q.reshape(b, -1, self.groups, self.head_dim)
            elif self.groups > 1:
                key = key.repeat_interleave(self.groups, dim=1)
                value = value.repeat_interleave(self.groups, dim=1)
            attn = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=0.0, scale=self.scaling)
            attn = attn.reshape(b, -1, k, self.head_dim).transpose(1, 2).reshape(b, k, -1)
            x = x + w.o(attn)
            h = _rms_norm(x, w.mlp_norm, w.mlp_eps)
            x = x + w.down(F.silu(w.gate(h)) * w.up(h))
        if logits_at is not None:
            x = x.gather(1, logits_at[..., None].expand(-1, -1, x.shape[-1]))          # [B, n, hidden]
        x = _rms_norm(x, self.norm, self.norm_eps)
        return self.lm_head(x)
