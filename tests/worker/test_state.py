"""The validity mask: rollback, truncation, compaction, join and leave keep logits exact; rows come and go
through free slots without copying the others."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specrouter.worker.forward import ModelForward
from specrouter.worker.state import FREE_SLOT_FRACTION, MaskedKVState, StateError
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
    (same storage); a join without a free slot grows the buffers by a slot, with room, so the next step
    writes in place again. Logits stay exact."""
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
    room = state.key_room[0].data_ptr()
    assert state.slots == ["a", "b"] and state.key_room[0].shape[2] > state.length
    logits = append(fwd, state, [[9], [9]])
    assert state.key_room[0].data_ptr() == room
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


# -- slots: rows leave and join in place -------------------------------------------------------------

def fresh_kv(fwd: ModelForward, tokens: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Keys and values of a row prefilled alone with its logical sequence: per layer [H, len, D]."""
    state = fwd.empty_state(["r"])
    if tokens:
        append(fwd, state, [tokens])
    return [k[0] for k in state.keys], [v[0] for v in state.values]


def prefilled(fwd: ModelForward, rows: dict[str, list[int]]) -> MaskedKVState:
    state = fwd.empty_state(list(rows))
    append(fwd, state, list(rows.values()))
    return state


def assert_rows_are(fwd: ModelForward, state: MaskedKVState, logical: dict[str, list[int]]) -> None:
    """Every live slot holds exactly its row's tokens, keys and values (as if prefilled alone); every free
    slot is all holes."""
    assert sorted(state.row_ids) == sorted(logical)
    assert state.live_holes() == state.slots.count(None)
    for s, r in enumerate(state.slots):
        mask = state.mask[s]
        if r is None:
            assert not bool(mask.any())
            continue
        assert state.row_tokens(s) == logical[r]
        keys, values = fresh_kv(fwd, logical[r])
        for layer in range(len(keys)):
            torch.testing.assert_close(state.keys[layer][s][:, mask], keys[layer], atol=ATOL, rtol=0)
            torch.testing.assert_close(state.values[layer][s][:, mask], values[layer], atol=ATOL, rtol=0)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_rows_leave_and_join_through_slots_as_if_built_from_scratch(fwd: ModelForward, data) -> None:
    """Any sequence of leaves, joins (shorter or longer than the state, past its room), blocks and
    rollbacks: every live row's keys, values, tokens and mask equal those of the row built alone, and a
    last block's logits equal a fresh prefill."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    names = iter(f"r{i}" for i in range(100))
    logical = {next(names): [rng.randrange(1, 64) for _ in range(rng.randrange(1, 6))]
               for _ in range(rng.randrange(1, 9))}
    state = prefilled(fwd, logical)
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["leave", "join", "extend", "rollback"]))
        if op == "leave" and logical:
            gone = rng.sample(sorted(logical), min(len(logical), rng.choice([1, 1, 2, 3, 8])))
            state.leave(gone)
            for r in gone:
                del logical[r]
            assert state.live_holes() <= FREE_SLOT_FRACTION * state.batch_size
        elif op == "join" or not logical:
            longest = data.draw(st.sampled_from([5, 20, 100]))
            new = {next(names): [rng.randrange(1, 64) for _ in range(rng.randrange(1, longest + 1))]
                   for _ in range(rng.randrange(1, 4))}
            state.join(prefilled(fwd, new))
            logical.update(new)
        elif op == "extend":
            seqs = [[rng.randrange(1, 64) for _ in range(rng.randrange(0, 5))] if r else [] for r in state.slots]
            append(fwd, state, seqs if any(seqs) else [[]] * state.batch_size)
            for r, s in zip(state.slots, seqs):
                if r is not None:
                    logical[r] += s
        else:
            counts = [rng.randrange(0, len(logical[r]) + 1) if r else 0 for r in state.slots]
            state.rollback(torch.tensor(counts))
            for r, c in zip(state.slots, counts):
                if r is not None:
                    logical[r] = logical[r][: len(logical[r]) - c]
        assert_rows_are(fwd, state, logical)
    if not logical:
        return
    seqs = [[rng.randrange(1, 64) for _ in range(rng.randrange(1, 4))] if r else [] for r in state.slots]
    logits = append(fwd, state, seqs)
    for s, (r, seq) in enumerate(zip(state.slots, seqs)):
        if r is not None:
            expected = fresh_logits(fwd, logical[r] + seq)[len(logical[r]):]
            torch.testing.assert_close(logits[s, : len(seq)], expected, atol=ATOL, rtol=0)
    assert torch.isfinite(logits).all()


def test_a_row_leaves_and_another_joins_in_place(fwd: ModelForward) -> None:
    """The leaving row's slot is freed and the joining row written into it, in the same buffers, even when
    the new row is longer than the state (its columns come out of the room)."""
    logical = {"a": [1, 2, 3], "b": [4, 5, 6, 7], "c": [8], "d": [9, 10]}
    state = prefilled(fwd, logical)
    rooms = [state.key_room[0].data_ptr(), state.value_room[0].data_ptr()]
    state.leave(["b"])
    assert state.slots == ["a", None, "c", "d"] and state.batch_size == 4 and state.live_holes() == 1
    del logical["b"]
    assert_rows_are(fwd, state, logical)
    logical["e"] = [11, 12, 13, 14, 15, 16]
    state.join(prefilled(fwd, {"e": logical["e"]}))
    assert state.slots == ["a", "e", "c", "d"] and state.length == 6
    assert [state.key_room[0].data_ptr(), state.value_room[0].data_ptr()] == rooms
    assert state.keys[0].data_ptr() == rooms[0]
    assert_rows_are(fwd, state, logical)
    logits = append(fwd, state, [[20], [21], [22], [23]])
    assert state.key_room[0].data_ptr() == rooms[0]
    for s, r in enumerate(state.slots):
        torch.testing.assert_close(logits[s, 0], fresh_logits(fwd, logical[r] + [20 + s])[-1], atol=ATOL, rtol=0)


def test_slots_are_compacted_exactly_when_more_than_a_quarter_are_free(fwd: ModelForward) -> None:
    logical = {r: [i + 1] * (i + 1) for i, r in enumerate("abcdefgh")}
    state = prefilled(fwd, logical)
    room = state.key_room[0].data_ptr()
    state.leave(["b"])
    state.leave(["h"])   # 2 of 8 free: 0.25, not more
    assert state.slots == ["a", None, "c", "d", "e", "f", "g", None] and state.key_room[0].data_ptr() == room
    state.leave(["d"])   # 3 of 8
    assert state.slots == ["a", "c", "e", "f", "g"] and state.live_holes() == 0
    assert state.length == 7 and state.key_room[0].data_ptr() != room
    for r in "bdh":
        del logical[r]
    assert_rows_are(fwd, state, logical)
    state.leave(["a"])   # 1 of 5
    assert state.slots == [None, "c", "e", "f", "g"]
    state.join(prefilled(fwd, {"x": [7], "y": [8, 9]}))   # one into the free slot, one appended
    assert state.slots == ["x", "c", "e", "f", "g", "y"]
    state.leave(["c", "e"])   # 2 of 6
    assert state.slots == ["x", "f", "g", "y"]
    with pytest.raises(StateError):
        state.leave(["c"])
