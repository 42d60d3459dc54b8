"""The offline similarity table: its maths on tiny models, the shipped demo table, its file format."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from specrouter.pool.load import PoolDir
from specrouter.pool.manifest import PoolError, PoolManifest, PoolMember
from specrouter.pool.similarity import (
    GREEDY,
    SAMPLING,
    SIMILARITY_NAME,
    PairSimilarity,
    load_similarity,
    measure_similarity,
    NextTokenDists,
    greedy_similarity,
    next_token_dists,
    pair_similarities,
    sampling_similarity,
    save_similarity,
)
from tests.conftest import DEMO_POOL, TINY_VOCAB

DRAFTER, TARGET = "stdlib-1m", "stdlib-29m"
SAMPLE_WINDOWS = 4
# 4 windows (512 positions, correlated within a window) against the shipped 32: the sample's
# agreement moves by a few hundredths from the full figure, so 0.1 leaves room without hiding a bug.
SAMPLE_TOLERANCE = 0.1
CARD_TOLERANCE = 0.05


def _random_windows(count: int = 4, seq_len: int = 16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, TINY_VOCAB, (count, seq_len + 1), generator=gen)  # [count, seq_len + 1]


def _by_key(pairs: list[PairSimilarity]) -> dict[tuple[str, str, str], PairSimilarity]:
    return {(p.drafter, p.verifier, p.mode): p for p in pairs}


@pytest.fixture(scope="module")
def tiny_pairs(tiny_pool) -> list[PairSimilarity]:
    windows = _random_windows()
    models = {name: engine.forward.model for name, engine in tiny_pool.items()}
    models["t-copy"] = copy.deepcopy(models["t"])
    return pair_similarities({name: next_token_dists(m, windows) for name, m in models.items()})


@pytest.fixture(scope="module")
def shipped() -> dict[tuple[str, str, str], PairSimilarity]:
    return _by_key(load_similarity(DEMO_POOL))


def test_a_model_and_its_copy_are_identical_in_both_modes(tiny_pairs) -> None:
    pairs = _by_key(tiny_pairs)
    for mode in (GREEDY, SAMPLING):
        assert pairs["t", "t-copy", mode].similarity == pytest.approx(1.0, abs=1e-6)
        assert pairs["t-copy", "t", mode].similarity == pytest.approx(1.0, abs=1e-6)


def test_hand_computed_overlaps() -> None:
    p = torch.tensor([[[0.5, 0.4, 0.1], [0.2, 0.2, 0.6]]])  # [1 window, 2 positions, vocab 3]
    q = torch.tensor([[[0.7, 0.1, 0.2], [0.1, 0.8, 0.1]]])
    d, v = NextTokenDists(p, p.argmax(-1)), NextTokenDists(q, q.argmax(-1))
    assert greedy_similarity(d, v) == 0.5  # position 0 agrees on token 0, position 1 does not
    # position 0: 0.5 + 0.1 + 0.1 = 0.7; position 1: 0.1 + 0.2 + 0.1 = 0.4
    assert sampling_similarity(d, v) == pytest.approx((0.7 + 0.4) / 2)


def test_different_models_are_less_than_identical(tiny_pairs) -> None:
    pairs = _by_key(tiny_pairs)
    assert pairs["s", "t", SAMPLING].similarity < 0.99
    assert all(0.0 <= p.similarity <= 1.0 for p in tiny_pairs)
    assert all(p.positions == 4 * 16 for p in tiny_pairs)
    # every ordered pair of distinct models, both modes
    assert len(tiny_pairs) == 4 * 3 * 2 and all(p.drafter != p.verifier for p in tiny_pairs)


def test_a_pool_of_one_checkpoint_under_two_names_is_identical(tmp_path: Path) -> None:
    """Through the whole path: manifest, loading, held-out windows."""
    checkpoint = (DEMO_POOL / DRAFTER).resolve()
    members = [PoolMember("a", str(checkpoint)), PoolMember("b", str(checkpoint))]
    PoolManifest(target="a", members=members).save(tmp_path)
    pairs = measure_similarity(PoolDir.open(tmp_path), windows=2, seq_len=32)
    assert {(p.drafter, p.verifier, p.mode) for p in pairs} == {
        ("a", "b", GREEDY), ("a", "b", SAMPLING), ("b", "a", GREEDY), ("b", "a", SAMPLING)}
    for p in pairs:
        assert p.similarity == pytest.approx(1.0, abs=1e-6) and p.positions == 2 * 32


def test_the_shipped_table_covers_every_ordered_pair(shipped) -> None:
    names = PoolDir.open(DEMO_POOL).names
    expected = {(d, v, m) for d in names for v in names if d != v for m in (GREEDY, SAMPLING)}
    assert set(shipped) == expected
    assert all(0.0 <= p.similarity <= 1.0 for p in shipped.values())


def test_the_shipped_table_is_reproduced_on_a_sample(shipped) -> None:
    pairs = _by_key(measure_similarity(PoolDir.open(DEMO_POOL), windows=SAMPLE_WINDOWS))
    for key in ((DRAFTER, TARGET, GREEDY), (TARGET, DRAFTER, GREEDY)):
        assert abs(pairs[key].similarity - shipped[key].similarity) < SAMPLE_TOLERANCE, key


def test_the_shipped_table_agrees_with_the_model_card(shipped) -> None:
    """The card's greedy agreement is the same statistic (argmax agreement on the same held-out stream,
    fp32) over a different sample: 64 windows of 256 tokens against the table's 32 of 128."""
    card = json.loads((DEMO_POOL / DRAFTER / "figures.json").read_text())
    table = shipped[DRAFTER, TARGET, GREEDY].similarity
    assert abs(table - card["greedy_agreement_with_target"]) < CARD_TOLERANCE


def test_save_and_load_round_trip(tiny_pairs, tmp_path: Path) -> None:
    path = save_similarity(tmp_path, tiny_pairs, windows=4, seq_len=16)
    assert path == tmp_path / SIMILARITY_NAME
    assert load_similarity(tmp_path) == tiny_pairs
    data = json.loads(path.read_text())
    assert (data["windows"], data["seq_len"]) == (4, 16)
    assert [(p["drafter"], p["verifier"], p["mode"]) for p in data["pairs"]] == sorted(
        (p.drafter, p.verifier, p.mode) for p in tiny_pairs)


def test_an_absent_file_gives_an_empty_table(tmp_path: Path) -> None:
    assert load_similarity(tmp_path) == []


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"windows": 1, "seq_len": 1}),
    json.dumps({"pairs": [{"drafter": "a", "verifier": "b", "mode": "greedy"}]}),
    json.dumps({"pairs": [{"drafter": "a", "verifier": "b", "mode": "beam", "similarity": 0.5, "positions": 1}]}),
    json.dumps({"pairs": [{"drafter": "a", "verifier": "b", "mode": "greedy", "similarity": 1.5, "positions": 1}]}),
    json.dumps({"pairs": [{"drafter": "a", "verifier": "b", "mode": "greedy", "similarity": "x", "positions": 1}]}),
], ids=["not-json", "no-pairs", "missing-field", "unknown-mode", "out-of-range", "not-a-number"])
def test_a_malformed_file_names_its_path(tmp_path: Path, content: str) -> None:
    path = tmp_path / SIMILARITY_NAME
    path.write_text(content)
    with pytest.raises(PoolError, match=re.escape(str(path))):
        load_similarity(tmp_path)
