"""The validity mask: rollback, truncation, compaction, join and leave keep logits exact."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specrouter.worker.forward import ModelForward
from specrouter.worker.state import StateError
from tests.conftest import tiny_llama

ATOL = 1e-5  # fp32; measured differences are ~1e-7


@pytest.fixture(scope="module")
def fwd() -> ModelForward:
    return ModelForward(tiny_llama(seed=7, hidden=32, layers=2))


def fresh_logits(fwd: ModelForward, tokens: list[int]) -> torch.Tensor:
    """Logits of a fresh prefill of the logical sequence: [len, vocab]."""
    with torch.inference_mode():
        return fwd.model(input_ids=torch.tensor([tokens])).logits[0].float()


def append(fwd: ModelForward, state, seqs: list[list[int]]) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
        valid[i, : len(s)] = True
    logits, _ = fwd(state, tokens, valid)
    return logits


def test_rollback_truncates_only_the_common_minimum(fwd: ModelForward) -> None:
    state = fwd.empty_state(["a", "b", "c"])
    append(fwd, state, [[1, 2, 3, 4, 5, 6]] * 3)
    state.rollback(torch.tensor([2, 5, 3]))
    assert state.length == 4  # r_min = 2 columns dropped physically
    assert state.valid_lengths().tolist() == [4, 1, 3]
    assert state.holes() == 0 + 3 + 1


def test_rollback_longer_than_a_row_is_refused(fwd: ModelForward) -> None:
    state = fwd.empty_state(["a"])
    append(fwd, state, [[1, 2]])
    with pytest.raises(StateError):
        state.rollback(torch.tensor([3]))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_generation_after_holes_matches_fresh_prefill(fwd: ModelForward, data) -> None:
    """Any sequence of appends, rollbacks, compactions and reorderings, then a block of new tokens:
    every row's logits equal a fresh prefill of its logical sequence."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    rows = ["a", "b", "c"]
    state = fwd.empty_state(rows)
    logical = {r: [] for r in rows}
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["append", "rollback", "compact", "reorder"]))
        if op == "append" or not any(logical.values()):
            seqs = [[rng.randrange(1, 64) for _ in range(rng.randrange(0, 5))] for _ in state.row_ids]
            append(fwd, state, seqs)
            for r, s in zip(state.row_ids, seqs):
                logical[r] += s
        elif op == "rollback":
            counts = [rng.randrange(0, len(logical[r]) + 1) for r in state.row_ids]
            state.rollback(torch.tensor(counts))
            for r, c in zip(state.row_ids, counts):
                logical[r] = logical[r][: len(logical[r]) - c]
        elif op == "compact":
            state.compact()
            assert state.holes() == state.batch_size * state.length - sum(len(v) for v in logical.values())
        else:
            order = list(state.row_ids)
            rng.shuffle(order)
            state.select(order)
        for b, r in enumerate(state.row_ids):
            assert state.row_tokens(b) == logical[r]
    seqs = [[rng.randrange(1, 64) for _ in range(rng.randrange(1, 5))] for _ in state.row_ids]
    logits = append(fwd, state, seqs)
    for b, (r, s) in enumerate(zip(state.row_ids, seqs)):
        expected = fresh_logits(fwd, logical[r] + s)[len(logical[r]):]
        torch.testing.assert_close(logits[b, : len(s)], expected, atol=ATOL, rtol=0)
        assert torch.isfinite(logits[b]).all()


def test_physical_positions_would_be_wrong(fwd: ModelForward) -> None:
    """Guards the test above: with a hole, a position equal to the physical column changes the logits."""
    state = fwd.empty_state(["a", "b"])
    append(fwd, state, [[5, 6, 7, 8], [5, 6]])  # row b has two holes at columns 2 and 3
    logits = append(fwd, state, [[9], [9]])
    physical = fresh_logits(fwd, [5, 6, 0, 0, 9])[-1]
    torch.testing.assert_close(logits[1, 0], fresh_logits(fwd, [5, 6, 9])[-1], atol=ATOL, rtol=0)
    assert (logits[1, 0] - physical).abs().max() > 1e-3


def test_rows_join_and_leave(fwd: ModelForward) -> None:
    a = fwd.empty_state(["a", "b"])
    append(fwd, a, [[1, 2, 3, 4, 5], [6, 7]])
    c = fwd.empty_state(["c"])
    append(fwd, c, [[8, 9, 10, 11, 12, 13, 14]])
    a.join(c)
    assert a.row_ids == ["a", "b", "c"] and a.length == 7
    a.select(["c", "a"])  # b leaves, order changes
    logits = append(fwd, a, [[15], [16, 17]])
    torch.testing.assert_close(logits[0, 0], fresh_logits(fwd, [8, 9, 10, 11, 12, 13, 14, 15])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1, :2], fresh_logits(fwd, [1, 2, 3, 4, 5, 16, 17])[-2:], atol=ATOL, rtol=0)
    with pytest.raises(StateError):
        a.join(fwd.empty_state(["a"]))


def test_decode_steps_write_into_the_room_without_copying_the_cache(fwd: ModelForward) -> None:
    """After a prefill the buffer has room: each one-token step, and a rollback then a step, writes in place
    (same storage); a join builds new tensors and the next step makes room again. Logits stay exact."""
    state = fwd.empty_state(["a"])
    seq = [3, 1, 4, 1, 5, 9, 2, 6]
    append(fwd, state, [seq])
    room = state.key_room[0].data_ptr()
    assert state.key_room[0].shape[2] > state.length
    for x in [5, 3, 5]:
        logits = append(fwd, state, [[x]])
        seq.append(x)
        assert state.key_room[0].data_ptr() == room
        assert state.keys[0].data_ptr() == room and state.keys[0].shape[2] == len(seq)
    torch.testing.assert_close(logits[0, -1], fresh_logits(fwd, seq)[-1], atol=ATOL, rtol=0)
    state.rollback(torch.tensor([2]))
    seq = seq[:-2]
    logits = append(fwd, state, [[7]])
    seq.append(7)
    assert state.key_room[0].data_ptr() == room
    torch.testing.assert_close(logits[0, -1], fresh_logits(fwd, seq)[-1], atol=ATOL, rtol=0)

    other = fwd.empty_state(["b"])
    append(fwd, other, [[2, 7, 1, 8]])
    state.join(other)
    assert state.key_room is None
    logits = append(fwd, state, [[9], [9]])
    assert state.key_room is not None and state.key_room[0].shape[2] > state.length
    torch.testing.assert_close(logits[0, -1], fresh_logits(fwd, seq + [9])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1, -1], fresh_logits(fwd, [2, 7, 1, 8, 9])[-1], atol=ATOL, rtol=0)


def test_the_room_grows_when_a_block_outruns_it(fwd: ModelForward) -> None:
    state = fwd.empty_state(["a"])
    append(fwd, state, [[1, 2, 3]])
    capacity = state.key_room[0].shape[2]
    seq = [1, 2, 3] + [(i % 50) + 1 for i in range(capacity)]
    logits = append(fwd, state, [seq[3:]])
    assert state.key_room[0].shape[2] >= len(seq)
    torch.testing.assert_close(logits[0], fresh_logits(fwd, seq)[3:], atol=ATOL, rtol=0)
