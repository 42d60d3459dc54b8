"""Model loading runs no code from a checkpoint: safetensors weights only, no model code of its own."""

from __future__ import annotations

import shutil

import pytest
import torch

from specrouter.pool.load import load_model
from specrouter.pool.manifest import PoolError
from tests.conftest import DEMO_POOL, REPO_ROOT


def test_a_checkpoint_with_pickle_weights_only_is_refused(tmp_path) -> None:
    """`pytorch_model.bin` is a pickle: loading one can run any code, so it is never loaded."""
    checkpoint = tmp_path / "pickled"
    checkpoint.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (DEMO_POOL / "stdlib-1m" / name).exists():
            shutil.copy(DEMO_POOL / "stdlib-1m" / name, checkpoint / name)
    torch.save({"model.embed_tokens.weight": torch.zeros(4, 4)}, checkpoint / "pytorch_model.bin")
    with pytest.raises(PoolError) as err:
        load_model(checkpoint)
    message = str(err.value)
    assert "no safetensors weights" in message and "pytorch_model.bin" in message and "never loaded" in message


def test_a_safetensors_checkpoint_loads() -> None:
    model = load_model(DEMO_POOL / "stdlib-1m")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_no_code_enables_remote_model_code() -> None:
    """No `trust_remote_code` anywhere in the package: a checkpoint's own Python never runs."""
    found = [str(p.relative_to(REPO_ROOT)) for folder in ("src", "services") for p in (REPO_ROOT / folder).rglob("*.py")
             if "trust_remote_code" in p.read_text()]
    assert found == []
