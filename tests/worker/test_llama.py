"""The lean Llama forward computes bit for bit what the model's own forward computes under the same mask, and
to rounding with its large projections prepacked for oneDNN."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specrouter.worker import llama
from specrouter.worker.forward import ModelForward
from tests.conftest import tiny_llama


def _steps(fwd: ModelForward, seed: int) -> list[torch.Tensor]:
    """Logits of a prefill with a ragged row, a rollback, one-token steps and a ragged block."""
    g = torch.Generator().manual_seed(seed)
    state = fwd.empty_state(["a", "b"])
    tokens = torch.randint(1, fwd.vocab_size, (2, 12), generator=g)
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 9:] = False
    out = [fwd(state, tokens, valid)[0]]
    state.rollback(torch.tensor([3, 1]))
    for _ in range(4):
        step = torch.randint(1, fwd.vocab_size, (2, 1), generator=g)
        out.append(fwd(state, step, torch.ones(2, 1, dtype=torch.bool))[0])
    block = torch.randint(1, fwd.vocab_size, (2, 5), generator=g)
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[0, 3:] = False
    out.append(fwd(state, block, valid)[0])
    return out


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_lean_logits_equal_the_models_own_bit_for_bit(kv_heads: int) -> None:
    torch.manual_seed(3)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=kv_heads,
                                         max_position_embeddings=128)).eval()
    lean, own = ModelForward(model, lean=True, prepack=False), ModelForward(model, lean=False)
    assert lean.lean is not None and own.lean is None
    for a, b in zip(_steps(lean, 0), _steps(own, 0), strict=True):
        assert torch.equal(a, b)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch has no oneDNN")
def test_prepacked_projections_give_the_models_logits_to_rounding() -> None:
    torch.manual_seed(4)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=128)).eval()
    packed = ModelForward(model)
    packed.lean = llama.LlamaForward(model, prepack_min=0)     # every projection, however small
    layer = packed.lean.layers[0]
    assert all(p.packed is not None for p in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down))
    own = ModelForward(model, lean=False)
    for a, b in zip(_steps(packed, 0), _steps(own, 0), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # the default packs only projections of at least PREPACK_MIN_ELEMENTS: none of this tiny model's
    default = ModelForward(model).lean
    assert default.layers[0].gate.packed is None and default.lm_head.packed is None


def test_projections_stay_with_pytorch_where_they_cannot_be_prepacked(monkeypatch) -> None:
    torch.manual_seed(5)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, max_position_embeddings=128)).eval()

    def refuse(*args, **kwargs):
        raise RuntimeError("no oneDNN reorder for this weight")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse, raising=False)
    lean = llama.LlamaForward(model, prepack_min=0)
    assert lean.layers[0].q.packed is None and lean.lm_head.packed is None
    own = ModelForward(model, lean=False)
    fwd = ModelForward(model)
    fwd.lean = lean
    for a, b in zip(_steps(fwd, 1), _steps(own, 1), strict=True):
        assert torch.equal(a, b)


def test_models_it_does_not_cover_run_through_transformers() -> None:
    eager = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, attn_implementation="eager")).eval()
    assert not llama.supports(eager)
    assert ModelForward(eager).lean is None
    with pytest.raises(ValueError, match="not a plain Llama"):
        llama.LlamaForward(eager)
    assert llama.supports(tiny_llama(seed=1, hidden=16, layers=1))
