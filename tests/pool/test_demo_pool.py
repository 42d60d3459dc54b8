"""The shipped demo pool: loadable with transformers' Auto classes, one tokenizer, the promised figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from specrouter.pool import corpus, evaluate
from specrouter.pool.family import TRAIN_SEQ_LEN
from specrouter.pool.load import PoolDir, tokenizer_fingerprint
from specrouter.pool.manifest import PoolError
from tests.conftest import DEMO_POOL

MAX_POOL_BYTES = 80 * 2**20
MIN_AGREEMENT = 0.6


@pytest.fixture(scope="module")
def pool() -> PoolDir:
    return PoolDir.open(DEMO_POOL)


def figures(pool: PoolDir, name: str) -> dict:
    return json.loads((pool.model_dir(name) / "figures.json").read_text())


def test_every_model_loads_with_auto_classes(pool) -> None:
    vocab = set()
    for name in pool.names:
        path = pool.model_dir(name)
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert model.config.model_type == "llama"
        assert len(tokenizer) == model.config.vocab_size
        vocab.add(model.config.vocab_size)
        with safe_open(path / "model.safetensors", "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    assert len(vocab) == 1


def test_pool_fits_in_the_repository() -> None:
    total = sum(p.stat().st_size for p in DEMO_POOL.rglob("*") if p.is_file())
    assert total <= MAX_POOL_BYTES, f"demo pool is {total / 2**20:.1f} MiB"


def test_parameters_span_ten_times(pool) -> None:
    params = {n: figures(pool, n)["parameters"] for n in pool.names}
    assert params[pool.target] == max(params.values())
    assert max(params.values()) >= 10 * min(params.values()), params


def test_smaller_models_agree_with_the_target(pool) -> None:
    for name in pool.names:
        if name != pool.target:
            assert figures(pool, name)["greedy_agreement_with_target"] >= MIN_AGREEMENT, name


def test_agreement_figures_are_reproduced_on_a_sample(pool) -> None:
    """Recomputes greedy agreement on 8 held-out windows; the card's figure (64 windows) must be close."""
    tok = AutoTokenizer.from_pretrained(pool.model_dir(pool.target))
    _, heldout = corpus.split(corpus.stdlib_files())
    ids = []
    for f in heldout:
        ids += tok(f.text)["input_ids"] + [tok.eos_token_id]
    windows = evaluate.heldout_windows(torch.tensor(ids), 8, TRAIN_SEQ_LEN)
    load = lambda n: AutoModelForCausalLM.from_pretrained(pool.model_dir(n), dtype=torch.float32)  # noqa: E731
    target = evaluate.score_heldout(load(pool.target), windows)
    for name in pool.names:
        if name != pool.target:
            sample = evaluate.greedy_agreement(evaluate.score_heldout(load(name), windows), target)
            assert abs(sample - figures(pool, name)["greedy_agreement_with_target"]) < 0.05, name


def test_model_cards_show_the_measured_figures(pool) -> None:
    for name in pool.names:
        card = (pool.model_dir(name) / "README.md").read_text()
        f = figures(pool, name)
        assert f"{f['parameters']:,}" in card
        assert f"{f['heldout_loss']:.3f}" in card
        assert f"{f['decode_ms_batch1']:.2f} ms" in card and f"{f['decode_ms_batch16']:.2f} ms" in card


def test_a_model_with_another_tokenizer_is_refused(pool, tmp_path: Path) -> None:
    copy = tmp_path / "pool"
    shutil.copytree(DEMO_POOL, copy)
    smallest = min(pool.names, key=lambda n: figures(pool, n)["parameters"])
    tok_path = copy / smallest / "tokenizer.json"
    data = json.loads(tok_path.read_text())
    data["model"]["merges"] = data["model"]["merges"][:-1]
    tok_path.write_text(json.dumps(data))
    assert tokenizer_fingerprint(copy / smallest) != tokenizer_fingerprint(copy / pool.target)
    with pytest.raises(PoolError, match=smallest):
        PoolDir.open(copy)
