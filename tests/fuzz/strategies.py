"""Hypothesis strategies for the fuzz tests: the router's public request, protobuf-shaped bytes, and the
worker's calls. Each leans to the edges (empty, zero, negative, huge, NaN, infinities, names that do not
exist) while keeping enough well-formed values that calls get past the first check."""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import strategies as st

from specrouter.v1 import router_pb2, worker_pb2
from tests.fuzz.conftest import COPY, DRAFTER, MODELS, TARGET, VOCAB

UINT32_MAX, INT32_MIN, INT32_MAX = 2**32 - 1, -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


def mostly(usual: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """`usual` more often than `odd`."""
    return st.one_of(usual, usual, usual, odd)


# floats as a proto `float` carries them (32 bits), with the values that break arithmetic drawn often
FLOAT32_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-45, 1e-38, 3.4e38, -3.4e38, math.nan, math.inf, -math.inf]
floats32 = st.one_of(st.sampled_from(FLOAT32_EDGES), st.floats(width=32))

# -- the router's GenerateRequest ---------------------------------------------------------------------

ODD_TEXT = ["", " ", "\n", "\x00", "\t\r\n", "\ufeff", "e\u0301\u0301\u0301", "\u202eevil", "\U0010ffff", "\uffff",
            "😀👩‍👩‍👧‍👦", "ﷺ", "\u200b" * 5, "def f(x):\n    return x\n", "import os\n", "class Stack:"]
REPEATED = ["x = 1\n", "a", "é", "😀", "\x00", " ", "def f(x):\n"]
# short (a few tokens), near the context end (1,024 tokens: "x = 1\n" is 4 tokens, so 250 of them leave room for
# 23 new ones), past it, past the prompt byte limit (1 MiB), past the gRPC message limit (4 MiB)
REPEATS = [1, 2, 50, 170, 250, 255, 1000, 5000, 300_000, 1_100_000, 5_000_000]

prompts = st.one_of(
    st.sampled_from(ODD_TEXT),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=64),   # lone surrogates cannot be UTF-8
    st.builds(lambda unit, n: unit * n, st.sampled_from(REPEATED), st.sampled_from(REPEATS)),
)

CHAIN_EDGES = ["", "auto", "AUTO", "target", " target ", ",", ",,", " , ", TARGET, f"{DRAFTER},{TARGET}",
               f"{DRAFTER},{COPY},{TARGET}", f"{COPY},{DRAFTER},{TARGET}", f"{DRAFTER},{DRAFTER},{TARGET}",
               f"{TARGET},{TARGET}", f"{TARGET},{DRAFTER}", f"{DRAFTER}", f" {DRAFTER} , {TARGET} ",
               f"{DRAFTER},,{TARGET}", f"nosuch,{TARGET}", "auto,target", f"{DRAFTER.upper()},{TARGET}"]
chain_names = st.one_of(
    st.sampled_from(CHAIN_EDGES),
    st.lists(st.sampled_from([*MODELS, "nosuch", "", " ", "target", "auto"]), max_size=5).map(",".join),
    st.text(max_size=24),
)


def _optional(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


@st.composite
def any_requests(draw) -> router_pb2.GenerateRequest:
    """Any GenerateRequest the message can carry: every field free at once."""
    fields = dict(
        prompt=draw(prompts),
        max_new_tokens=draw(_optional(mostly(st.integers(1, 48), st.sampled_from([0, 49, 1000, UINT32_MAX])))),
        temperature=draw(mostly(st.sampled_from([0.0, 0.0, 0.7, 1.0]), floats32)),
        top_p=draw(_optional(mostly(st.sampled_from([1.0, 0.9, 0.5]), floats32))),
        top_k=draw(mostly(st.sampled_from([0, 0, 1, 5, 50]), st.integers(INT32_MIN, INT32_MAX))),
        repetition_penalty=draw(_optional(mostly(st.sampled_from([1.0, 1.3, 0.8]), floats32))),
        seed=draw(_optional(st.integers(INT64_MIN, INT64_MAX))),
        stop=draw(stop_lists),
        chain=draw(chain_names),
        window=draw(mostly(st.integers(0, 8), st.sampled_from([16, 17, 1000, 2**31, UINT32_MAX]))),
    )
    return router_pb2.GenerateRequest(**{k: v for k, v in fields.items() if v is not None})


stop_lists = st.lists(st.one_of(st.sampled_from(["", "\n", "\n\n", ")", "return", "😀" * 50, "x" * 5000]),
                                st.text(max_size=8)), max_size=20)
GOOD_CHAINS = ["", "auto", "target", f"{DRAFTER},{TARGET}", f"{COPY},{TARGET}", f"{DRAFTER},{COPY},{TARGET}",
               f"{COPY},{DRAFTER},{TARGET}"]
# each field's values that the router should refuse or survive, for a request otherwise well-formed
ODD_FIELDS = {
    "prompt": prompts,
    "max_new_tokens": st.sampled_from([0, 49, 1000, UINT32_MAX]),
    "temperature": floats32,
    "top_p": floats32,
    "top_k": st.integers(INT32_MIN, INT32_MAX),
    "repetition_penalty": floats32,
    "seed": st.integers(INT64_MIN, INT64_MAX),
    "stop": stop_lists,
    "chain": chain_names,
    "window": st.sampled_from([16, 17, 1000, 2**31, UINT32_MAX]),
}


@st.composite
def defective_requests(draw) -> router_pb2.GenerateRequest:
    """A well-formed request (greedy or sampled, any chain of the pool, short stop strings) with, half the time,
    one field set to an odd value: requests that run, and requests that each reach one check."""
    fields = dict(
        prompt=draw(st.one_of(st.sampled_from(ODD_TEXT[13:]), st.text(st.characters(codec="utf-8"), min_size=1, max_size=40))),
        max_new_tokens=draw(_optional(st.integers(1, 48))),
        temperature=draw(st.one_of(st.just(0.0), st.floats(0.3, 1.5))),
        top_p=draw(_optional(st.floats(0.3, 1.0))),
        top_k=draw(st.integers(0, 100)),
        repetition_penalty=draw(_optional(st.floats(0.5, 2.0))),
        seed=draw(_optional(st.integers(0, 2**40))),
        stop=draw(st.lists(st.sampled_from(["\n\n", ")", "return", ":"]), max_size=3)),
        chain=draw(st.sampled_from(GOOD_CHAINS)),
        window=draw(st.integers(0, 8)),
    )
    odd = draw(st.sampled_from([None] * len(ODD_FIELDS) + list(ODD_FIELDS)))
    if odd:
        fields[odd] = draw(ODD_FIELDS[odd])
    return router_pb2.GenerateRequest(**{k: v for k, v in fields.items() if v is not None})


generate_requests = st.one_of(defective_requests(), any_requests())


# -- bytes on the wire --------------------------------------------------------------------------------

def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of n mod 2**64 (negative numbers take ten bytes, as protobuf sends them)."""
    n &= UINT64_MAX
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@st.composite
def wire_fields(draw) -> bytes:
    """One protobuf field with any number, any wire type and a payload that may contradict both."""
    number = draw(st.one_of(st.integers(1, 12), st.sampled_from([0, 19000, 2**29 - 1])))
    wire_type = draw(st.integers(0, 7))
    if wire_type == 0:
        payload = varint(draw(st.one_of(st.integers(-2, 300), st.integers(INT64_MIN, UINT64_MAX))))
    elif wire_type == 1:
        payload = draw(st.binary(min_size=8, max_size=8))
    elif wire_type == 2:
        body = draw(st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode),
                              st.sampled_from([b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"stdlib-5m"])))
        length = draw(st.one_of(st.just(len(body)), st.integers(0, 2**32)))   # sometimes a lie
        payload = varint(length) + body
    elif wire_type == 5:
        payload = draw(st.one_of(st.binary(min_size=4, max_size=4), floats32.map(lambda f: struct.pack("<f", f))))
    else:
        payload = b""   # groups (3, 4) and the undefined types 6 and 7
    return varint((number << 3) | wire_type) + payload


@st.composite
def mutated(draw, message: st.SearchStrategy) -> bytes:
    """A well-formed message's bytes, cut short, with bytes flipped or with bytes added."""
    data = bytearray(draw(message).SerializeToString())
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["cut", "flip", "insert"]))
        at = draw(st.integers(0, len(data)))
        if how == "cut":
            data = data[:at]
        elif how == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
    return bytes(data)


# short prompts only: a parsed prompt of random bytes is generated like any other request
small_requests = generate_requests.filter(lambda m: len(m.prompt) < 10_000)
raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.lists(wire_fields(), max_size=6).map(b"".join),
    mutated(small_requests),
    mutated(st.builds(router_pb2.ScheduleRequest, greedy_rows=st.integers(0, 5000), sampling_rows=st.integers(0, 5000))),
)

# -- the worker's calls -------------------------------------------------------------------------------
#
# A script is a prefill and a few calls on its state. Each call is made well-formed (every row of the state,
# in any order, with a pending token and parameters that pass), then, half the time, given one defect of
# the kinds below, so that calls both get past the checks and hit each check.

FUZZ_STATES = ["fuzz-0", "fuzz-1", ""]      # never the well-formed client's state
ROW_IDS = ["a", "b", "c", ""]
valid_tokens = st.integers(0, VOCAB - 1)
bad_tokens = st.sampled_from([-1, VOCAB, INT32_MAX, INT32_MIN])
# rows as long as the context (1,024) allows, and longer
long_token_lists = st.builds(lambda t, n: [t] * n, valid_tokens, st.sampled_from([1000, 1019, 1020, 1023, 1024, 1025, 2000]))
huge_uints = st.sampled_from([5, 100, 1023, 1024, 2**31, UINT32_MAX])

GREEDY = worker_pb2.Sampling(top_p=1.0, repetition_penalty=1.0)
good_samplings = st.one_of(
    st.just(GREEDY),
    st.builds(worker_pb2.Sampling, temperature=st.sampled_from([0.7, 1.0]), top_p=st.sampled_from([1.0, 0.9]),
              top_k=st.sampled_from([0, 5]), repetition_penalty=st.sampled_from([1.0, 1.2]),
              seed=st.integers(INT64_MIN, INT64_MAX)))
any_samplings = st.builds(worker_pb2.Sampling, temperature=floats32, top_p=floats32, repetition_penalty=floats32,
                          top_k=st.integers(INT32_MIN, INT32_MAX), seed=st.integers(INT64_MIN, INT64_MAX))


def _fp16(values) -> bytes:
    return np.asarray(values, dtype=np.float16).tobytes()


def _int32(values) -> bytes:
    return np.asarray(values, dtype=np.int32).tobytes()


WELL_FORMED_ROWS = ["uniform", "one-hot", "sparse"]
BROKEN_ROWS = ["short", "odd bytes", "empty", "bad index", "index count", "nan", "inf", "negative", "zeros", "random"]


@st.composite
def distribution_rows(draw, token: int, kinds: list[str]) -> worker_pb2.DistributionRow:
    """A row for a proposal token: well-formed (dense or sparse) or broken in one of the ways bytes can be."""
    kind = draw(st.sampled_from(kinds))
    token = token if 0 <= token < VOCAB else 0
    if kind == "uniform":
        return worker_pb2.DistributionRow(values_fp16=_fp16(np.full(VOCAB, 1.0 / VOCAB)))
    if kind == "one-hot":
        row = np.zeros(VOCAB)
        row[token] = 1.0
        return worker_pb2.DistributionRow(values_fp16=_fp16(row))
    if kind == "sparse":
        return worker_pb2.DistributionRow(values_fp16=_fp16([0.75, 0.25]), indices_int32=_int32([token, (token + 1) % VOCAB]))
    if kind == "short":
        return worker_pb2.DistributionRow(values_fp16=_fp16(np.full(draw(st.sampled_from([1, VOCAB - 1, VOCAB + 1])), 0.01)))
    if kind == "odd bytes":
        return worker_pb2.DistributionRow(values_fp16=b"\x00" * (2 * VOCAB - 1))
    if kind == "empty":
        return worker_pb2.DistributionRow()
    if kind == "bad index":
        return worker_pb2.DistributionRow(values_fp16=_fp16([1.0]), indices_int32=_int32([draw(bad_tokens)]))
    if kind == "index count":
        return worker_pb2.DistributionRow(values_fp16=_fp16([0.5, 0.5]), indices_int32=_int32([token]))
    if kind in ("nan", "inf", "negative", "zeros"):
        value = {"nan": math.nan, "inf": math.inf, "negative": -1.0, "zeros": 0.0}[kind]
        return worker_pb2.DistributionRow(values_fp16=_fp16(np.full(VOCAB, value)))
    return worker_pb2.DistributionRow(values_fp16=draw(st.binary(max_size=16)), indices_int32=draw(st.binary(max_size=16)))


@st.composite
def _steps(draw, row_id: str) -> worker_pb2.RowStep:
    return worker_pb2.RowStep(row_id=row_id, pending_tokens=draw(st.lists(valid_tokens, min_size=1, max_size=3)),
                              sampling=draw(good_samplings), cycle=draw(st.integers(0, 50)))


@st.composite
def _proposals(draw, row_id: str, sampled: bool) -> worker_pb2.Proposal:
    proposed = draw(st.lists(valid_tokens, max_size=5))
    rows = [draw(distribution_rows(t, WELL_FORMED_ROWS)) for t in proposed] if sampled else []
    return worker_pb2.Proposal(row_id=row_id, tokens=proposed, rows=rows)


@st.composite
def prefills(draw, state: str = FUZZ_STATES[0]) -> worker_pb2.PrefillRequest:
    rows = [worker_pb2.PrefillRow(row_id=r, tokens=draw(st.lists(valid_tokens, max_size=8)))
            for r in draw(st.lists(st.sampled_from(ROW_IDS), min_size=1, max_size=3, unique=True))]
    request = worker_pb2.PrefillRequest(state_id=state, rows=rows, predictions=draw(st.integers(0, 4)))
    defect = draw(st.sampled_from([None] * 5 + ["state", "no rows", "duplicate", "bad token", "long", "predictions"]))
    if defect == "state":
        request.state_id = draw(st.sampled_from(FUZZ_STATES))
    elif defect == "no rows":
        del request.rows[:]
    elif defect == "duplicate":
        request.rows.append(request.rows[0])
    elif defect == "bad token":
        request.rows[0].tokens.append(draw(bad_tokens))
    elif defect == "long":
        request.rows[-1].tokens[:] = draw(long_token_lists)
    elif defect == "predictions":
        request.predictions = draw(huge_uints)
    return request


STEP_DEFECTS = ["state", "missing row", "duplicate row", "unknown row", "rollback", "no pending", "bad pending",
                "long pending", "sampling", "cycle", "level"]


def _break_steps(draw, request, steps: list[worker_pb2.RowStep], defect: str) -> None:
    """Gives a Draft or Verify request `defect` (`steps`: its rows' steps, in place)."""
    if defect == "state":
        request.state_id = draw(st.sampled_from([*FUZZ_STATES, "never-made"]))
    elif defect == "missing row" and steps:
        del request.rows[draw(st.integers(0, len(steps) - 1))]
    elif defect == "duplicate row" and steps:
        request.rows.append(request.rows[0])
    elif defect == "unknown row":
        row = request.rows.add()
        if isinstance(row, worker_pb2.VerifyRow):
            row.step.CopyFrom(worker_pb2.RowStep(row_id="zz", pending_tokens=[1], sampling=GREEDY))
        else:
            row.CopyFrom(worker_pb2.RowStep(row_id="zz", pending_tokens=[1], sampling=GREEDY))
    elif steps:
        step = steps[draw(st.integers(0, len(steps) - 1))]
        if defect == "rollback":
            step.rollback = draw(st.one_of(st.integers(1, 4), huge_uints))
        elif defect == "no pending":
            del step.pending_tokens[:]
        elif defect == "bad pending":
            step.pending_tokens.append(draw(bad_tokens))
        elif defect == "long pending":
            step.pending_tokens[:] = draw(long_token_lists)
        elif defect == "sampling":
            step.sampling.CopyFrom(draw(any_samplings))
        elif defect == "cycle":
            step.cycle = draw(st.sampled_from([INT64_MAX, 2**63, UINT64_MAX]))
    if defect == "level":
        request.level = draw(huge_uints)


@st.composite
def drafts(draw, state: str = FUZZ_STATES[0], rows: tuple[str, ...] = ("a",)) -> worker_pb2.DraftRequest:
    request = worker_pb2.DraftRequest(state_id=state, window=draw(st.integers(1, 5)),
                                      rows=[draw(_steps(r)) for r in draw(st.permutations(rows))])
    defect = draw(st.sampled_from([None] * len(STEP_DEFECTS) + STEP_DEFECTS + ["window"]))
    if defect == "window":
        request.window = draw(st.sampled_from([0, 16, 17, 1000, UINT32_MAX]))
    elif defect:
        _break_steps(draw, request, list(request.rows), defect)
    return request


PROPOSAL_DEFECTS = ["bad token", "long proposal", "row count", "broken row", "row id", "hand up"]


@st.composite
def verifies(draw, state: str, rows: tuple[str, ...]) -> worker_pb2.VerifyRequest:
    verify_rows = []
    for r in draw(st.permutations(rows)):
        step = draw(_steps(r))
        verify_rows.append(worker_pb2.VerifyRow(step=step, proposal=draw(_proposals(r, step.sampling.temperature > 0))))
    request = worker_pb2.VerifyRequest(state_id=state, level=draw(st.integers(1, 3)), hand_up=draw(st.booleans()),
                                       rows=verify_rows)
    defects = STEP_DEFECTS + PROPOSAL_DEFECTS
    defect = draw(st.sampled_from([None] * len(defects) + defects))
    if defect in PROPOSAL_DEFECTS and verify_rows:
        proposal = request.rows[draw(st.integers(0, len(verify_rows) - 1))].proposal
        if defect == "bad token":
            proposal.tokens.append(draw(bad_tokens))
        elif defect == "long proposal":
            proposal.tokens[:] = draw(st.lists(valid_tokens, min_size=17, max_size=1030))
        elif defect == "row count":
            proposal.rows.append(draw(distribution_rows(0, WELL_FORMED_ROWS)))
        elif defect == "broken row":
            proposal.tokens.append(draw(valid_tokens))
            del proposal.rows[:]
            proposal.rows.extend(draw(distribution_rows(t, BROKEN_ROWS)) for t in proposal.tokens)
        elif defect == "row id":
            proposal.row_id = "other"
        elif defect == "hand up":
            request.hand_up = not request.hand_up
    elif defect:
        _break_steps(draw, request, [r.step for r in request.rows], defect)
    return request


@st.composite
def releases(draw, state: str, rows: tuple[str, ...]) -> worker_pb2.ReleaseRequest:
    return worker_pb2.ReleaseRequest(state_id=draw(mostly(st.just(state), st.sampled_from([*FUZZ_STATES, "never-made"]))),
                                     row_ids=draw(st.lists(st.sampled_from([*rows, *ROW_IDS, "zz"]), max_size=3)))


@st.composite
def worker_scripts(draw) -> tuple[worker_pb2.PrefillRequest, list[tuple[str, object]]]:
    """A prefill that usually makes a state with rows, then calls that usually name that state and its rows."""
    state = draw(st.sampled_from(FUZZ_STATES))
    prefill = draw(prefills(state))
    rows = tuple(dict.fromkeys(r.row_id for r in prefill.rows))
    call = st.one_of(st.tuples(st.just("Draft"), drafts(state, rows)), st.tuples(st.just("Verify"), verifies(state, rows)),
                     st.tuples(st.just("Prefill"), prefills(state)), st.tuples(st.just("Release"), releases(state, rows)))
    return prefill, draw(st.lists(call, min_size=1, max_size=5))


worker_raw_bodies = st.one_of(st.binary(max_size=64), st.lists(wire_fields(), max_size=6).map(b"".join),
                              mutated(prefills()), mutated(drafts()))
