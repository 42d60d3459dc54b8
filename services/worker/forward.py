"""A forward pass of a Hugging Face causal LM over a masked KV state.

The caller hands new tokens as a right-padded block [B, k] with a validity mask; valid tokens are
left-aligned in every row. The attention mask is built here as a 4-D additive mask so that
- a valid query attends to every valid key at or before its physical column,
- a hole (padding) query attends only to itself, which keeps every softmax finite; no valid query
  ever attends to a hole, so what holes compute is never read.
Llama-family models run through `llama.LlamaForward` (the same operations without transformers' module
machinery); others through the model's own forward with the state handed over as a cache.
"""

from __future__ import annotations

import inspect
import time

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from specrouter.worker import llama
from specrouter.contract.calls import ForwardTiming
from specrouter.worker.state import MaskedKVState, grown, room_for

PAD_TOKEN_ID = 0  # what a hole holds; never attended to


class RoomLayer(CacheLayerMixin):
    """One layer's cache over a buffer with room past its length: an update writes the new columns in place.

    Transformers' DynamicLayer concatenates the whole cache with every step's new columns, a copy that
    grows with the context. Here a buffer [B, H, C, D] is written at [L, L + k) and the attention reads the
    view [:, :, :L + k]; when the room runs out the buffer grows by half its length (at least state.ROOM_MIN),
    so copies are amortised to O(1) per token.
    """

    is_sliding = False

    def __init__(self, key_room: torch.Tensor, value_room: torch.Tensor, length: int):
        super().__init__()
        self.key_room, self.value_room, self.length = key_room, value_room, length
        self.keys, self.values = key_room[:, :, :length], value_room[:, :, :length]
        self.device = key_room.device
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # the buffers exist from the start

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self.key_room.shape[2]:
            capacity = room_for(end)
            self.key_room = grown(self.key_room, self.length, capacity)
            self.value_room = grown(self.value_room, self.length, capacity)
        self.key_room[:, :, self.length:end] = key_states
        self.value_room[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.key_room[:, :, :end], self.value_room[:, :, :end]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1


class ModelForward:
    """Wraps a loaded causal LM; runs blocks of new tokens against `MaskedKVState`s."""

    def __init__(self, model: PreTrainedModel, lean: bool = True, prepack: bool = True):
        """`lean`: run Llama-family models through `llama.LlamaForward` (same operations, less Python);
        `prepack`: with their large projections prepacked for oneDNN on the CPU (faster; logits equal to
        rounding, not bit for bit)."""
        self.model = model.eval()
        self.lean = (llama.LlamaForward(model, llama.PREPACK_MIN_ELEMENTS if prepack else None)
                     if lean and llama.supports(model) else None)
        cfg = model.config
        self.layers = cfg.num_hidden_layers
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.vocab_size = cfg.vocab_size
        self.context_length = cfg.max_position_embeddings
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x
        # read once: the model's own properties walk its parameters on every access
        self.device: torch.device = model.device
        self.dtype: torch.dtype = model.dtype

    def empty_state(self, row_ids: list[str]) -> MaskedKVState:
        return MaskedKVState.empty(row_ids, self.layers, self.kv_heads, self.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def __call__(self, state: MaskedKVState, tokens: torch.Tensor, valid: torch.Tensor,
                 logits_at: torch.Tensor | None = None) -> tuple[torch.Tensor, ForwardTiming]:
        """Appends tokens [B, k] (valid [B, k]) to `state`; returns logits [B, k, vocab] in fp32, or only at
        the block's columns `logits_at` [B, n]: [B, n, vocab]. Asking for the columns a caller reads skips
        the output head elsewhere (a prefill reads none, or a few), which saves its time and its largest
        tensor."""
        b, k = tokens.shape
        device = self.device
        tokens, valid = tokens.to(device), valid.to(device)
        if logits_at is not None:
            logits_at = logits_at.to(device)
        if k == 0:
            n = k if logits_at is None else logits_at.shape[1]
            return torch.zeros(b, n, self.vocab_size, device=device), ForwardTiming(0, b, 0, 0)
        start = time.perf_counter_ns()
        before = state.valid_lengths()                                  # [B]
        positions = before[:, None] + (valid.long().cumsum(1) - 1).clamp(min=0)  # [B, k] logical
        mask4 = self._attention_mask(state.mask, valid)                 # [B, 1, k, L + k]
        key_room = state.key_room or state.keys
        value_room = state.value_room or state.values
        layers = [RoomLayer(kr, vr, state.length) for kr, vr in zip(key_room, value_room)]
        ids = torch.where(valid, tokens, PAD_TOKEN_ID)
        if self.lean is not None:
            logits = self.lean(ids, positions, mask4, layers, logits_at).float()
        else:
            out = self.model(input_ids=ids, attention_mask=mask4, position_ids=positions, use_cache=True,
                             **{self._cache_kwarg: Cache(layers=layers)})
            logits = out.logits.float()
            if logits_at is not None:
                logits = logits.gather(1, logits_at[..., None].expand(-1, -1, logits.shape[-1]))
        state.append([layer.key_room for layer in layers], [layer.value_room for layer in layers], tokens, valid)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timing = ForwardTiming(time.perf_counter_ns() - start, b, k, int(valid.sum()))
        return logits, timing

    def _attention_mask(self, past_valid: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
        b, k = new_valid.shape
        past = past_valid.shape[1]
        keys_valid = torch.cat([past_valid, new_valid], dim=1)               # [B, L + k]
        neg = torch.finfo(self.dtype).min
        if k == 1 and bool(new_valid.all()):   # one valid query a row, the last column: every valid key
            return torch.zeros(keys_valid.shape, dtype=self.dtype, device=keys_valid.device).masked_fill_(
                ~keys_valid, neg)[:, None, None]
        q_col = past + torch.arange(k, device=keys_valid.device)            # physical column of each query
        k_col = torch.arange(past + k, device=keys_valid.device)
        causal = k_col[None, :] <= q_col[:, None]                            # [k, L + k]
        allowed = causal[None] & keys_valid[:, None, :]                      # [B, k, L + k]
        self_only = (k_col[None, :] == q_col[:, None])[None] & ~new_valid[:, :, None]
        allowed = allowed | self_only
        return torch.zeros(allowed.shape, dtype=self.dtype, device=keys_valid.device).masked_fill_(~allowed, neg)[:, None]
