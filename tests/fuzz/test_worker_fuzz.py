"""Fuzzing a live worker: scripts of Prefill, Draft, Verify and Release calls (unknown states and rows,
duplicate rows, rollbacks past what a row holds, tokens outside the vocabulary, proposals whose rows are
the wrong size or not fp16 at all, windows of 0 or 2**32 - 1, rows at the context's end), and any bytes as
the body of each method.

Properties, for every example:
- every call ends OK or with a status that names the caller's mistake (INVALID_ARGUMENT, OUT_OF_RANGE,
  FAILED_PRECONDITION, NOT_FOUND, RESOURCE_EXHAUSTED), with a message; never INTERNAL or UNKNOWN;
- an OK answer is well-formed (one proposal a row, the window's tokens, an accepted prefix of the proposal
  plus one token, every id inside the vocabulary, every returned row a distribution);
- a state a well-formed client made before the fuzz gives the same tokens and rows, bit for bit, after
  each example;
and afterwards the worker is alive and holds that state alone.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import example

from specrouter.v1 import worker_pb2 as pb
from specrouter.v1 import worker_pb2_grpc
from tests.fuzz.conftest import CALL_TIMEOUT_S, DRAFTER, VOCAB, call, check_status, quick_and_long, worker
from tests.fuzz.strategies import FUZZ_STATES, worker_raw_bodies, worker_scripts

SERVICE = "/specrouter.v1.WorkerService/"
ACCEPTABLE = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
              grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
GREEDY = pb.Sampling(top_p=1.0, repetition_penalty=1.0)
SAMPLED = pb.Sampling(temperature=0.8, top_p=0.95, top_k=50, repetition_penalty=1.1, seed=11)
REF_STATE, REF_WINDOW = "well-formed", 4
REF_ROWS = {"greedy": ([17, 230, 1045, 9, 3000, 52, 52, 811], GREEDY),     # prompt tokens, sampling
            "sampled": ([400, 401, 402, 7, 7, 1999, 64], SAMPLED)}


def decode_rows(rows) -> list[np.ndarray]:
    """Dense fp32 rows of a proposal (sparse rows scattered)."""
    out = []
    for r in rows:
        values = np.frombuffer(r.values_fp16, dtype=np.float16).astype(np.float32)
        if r.indices_int32:
            dense = np.zeros(VOCAB, dtype=np.float32)
            dense[np.frombuffer(r.indices_int32, dtype=np.int32)] = values
            values = dense
        out.append(values)
    return out


def check_rows(rows, count: int) -> None:
    assert len(rows) in (0, count)
    for values in decode_rows(rows):
        assert values.shape == (VOCAB,) and np.isfinite(values).all() and (values >= 0).all() and values.sum() > 0


class Reference:
    """A state a well-formed client made: a greedy row and a sampled one. A probe drafts from the same point
    every time (rolling back what the last probe added) and verifies the draft, so it answers the same."""

    def __init__(self, stub: worker_pb2_grpc.WorkerServiceStub):
        self.stub = stub
        stub.Prefill(pb.PrefillRequest(state_id=REF_STATE, rows=[pb.PrefillRow(row_id=r, tokens=t[:-1])
                                                                 for r, (t, _) in REF_ROWS.items()]))
        self.added = 0   # tokens the last probe left in each row
        self.expected = self.probe()

    def _step(self, row: str, rollback: int) -> pb.RowStep:
        tokens, sampling = REF_ROWS[row]
        return pb.RowStep(row_id=row, rollback=rollback, pending_tokens=tokens[-1:], sampling=sampling, cycle=3)

    def probe(self) -> list[bytes]:
        draft = self.stub.Draft(pb.DraftRequest(state_id=REF_STATE, level=0, window=REF_WINDOW,
                                                rows=[self._step(r, self.added) for r in REF_ROWS]),
                                timeout=CALL_TIMEOUT_S)
        # the draft processed the pending token and all but the last drafted one: roll those back
        rows = [pb.VerifyRow(step=self._step(r, REF_WINDOW), proposal=p) for r, p in zip(REF_ROWS, draft.proposals)]
        verify = self.stub.Verify(pb.VerifyRequest(state_id=REF_STATE, level=1, hand_up=True, rows=rows),
                                  timeout=CALL_TIMEOUT_S)
        self.added = 1 + REF_WINDOW   # the pending token and the proposal
        return [p.SerializeToString(deterministic=True) for p in [*draft.proposals, *verify.proposals]]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    """A worker of its own (the router's workers must end the router's fuzz without states)."""
    proc = worker(tmp_path_factory.mktemp("fuzz-worker"), DRAFTER)
    channel = grpc.insecure_channel(proc.address, options=[("grpc.max_send_message_length", 64 << 20)])
    try:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        reference = Reference(stub)
        yield proc, channel, stub, reference
        assert proc.alive(), f"the worker exited: {proc.log_tail()}"
        assert reference.probe() == reference.expected
        assert stub.Info(pb.InfoRequest()).live_states == 1   # the well-formed client's state alone
    finally:
        channel.close()
        proc.stop()


def check_reply(method: str, request, reply) -> None:
    if method == "Prefill" and request.predictions:
        assert len(reply.predictions) == len(request.rows)
        for row, guesses in zip(request.rows, reply.predictions):
            assert len(guesses.tokens) == min(request.predictions, len(row.tokens))
            assert all(0 <= t < VOCAB for t in guesses.tokens)
    elif method == "Draft":
        assert len(reply.proposals) == len(request.rows)
        for row, p in zip(request.rows, reply.proposals):
            assert p.row_id == row.row_id and len(p.tokens) == request.window
            assert all(0 <= t < VOCAB for t in p.tokens)
            check_rows(p.rows, request.window)
    elif method == "Verify":
        assert len(reply.proposals) == len(request.rows)
        for row, p in zip(request.rows, reply.proposals):
            proposed = list(row.proposal.tokens)
            assert p.row_id == row.step.row_id and len(p.tokens) == p.accepted + 1 and p.accepted <= len(proposed)
            assert list(p.tokens[:-1]) == proposed[: p.accepted] and 0 <= p.tokens[-1] < VOCAB
            check_rows(p.rows, len(p.tokens))


def run_script(fuzzed, script) -> None:
    _, _, stub, reference = fuzzed
    prefill, calls = script
    try:
        for method, request in [("Prefill", prefill), *calls]:
            code, details, reply = call(getattr(stub, method), request)
            check_status(method, code, details, ACCEPTABLE)
            if reply is not None:
                check_reply(method, request, reply)
    finally:
        for state in FUZZ_STATES:
            call(stub.Release, pb.ReleaseRequest(state_id=state))
    assert reference.probe() == reference.expected, "the well-formed client's state answers differently"
    assert stub.Info(pb.InfoRequest()).live_states == 1, "the example left a state the worker still holds"


def run_raw(fuzzed, body: bytes) -> None:
    _, channel, stub, reference = fuzzed
    try:
        for method in ("Info", "Prefill", "Draft", "Verify", "Release"):
            raw = channel.unary_unary(SERVICE + method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            code, details, _ = call(raw, body)
            check_status(f"{method} with body {body[:64]!r}", code, details, ACCEPTABLE)
    finally:
        for state in {*FUZZ_STATES, *_prefilled_state(body)} - {REF_STATE}:
            call(stub.Release, pb.ReleaseRequest(state_id=state))
    assert reference.probe() == reference.expected, "the well-formed client's state answers differently"
    assert stub.Info(pb.InfoRequest()).live_states == 1, "the example left a state the worker still holds"


def _prefilled_state(body: bytes) -> list[str]:
    """The state a body sent to Prefill may have made: a mutated body names states of any id."""
    try:
        return [pb.PrefillRequest.FromString(body).state_id]
    except Exception:  # noqa: BLE001 - no PrefillRequest: the worker refused it and made nothing
        return []


def _rows(*ids: str, tokens=(5, 6, 7)) -> list[pb.PrefillRow]:
    return [pb.PrefillRow(row_id=r, tokens=list(tokens)) for r in ids]


def _step(row: str, **fields) -> pb.RowStep:
    return pb.RowStep(row_id=row, pending_tokens=fields.pop("pending", [8]), sampling=fields.pop("sampling", GREEDY),
                      **fields)


SAMPLING_T1 = pb.Sampling(temperature=1.0, top_p=1.0, repetition_penalty=1.0)


def _draft(*rows: pb.RowStep, window: int = 2) -> tuple[str, pb.DraftRequest]:
    return "Draft", pb.DraftRequest(state_id="fuzz-0", window=window, rows=rows)


def _verify_with_row(row: pb.DistributionRow) -> tuple[str, pb.VerifyRequest]:
    proposal = pb.Proposal(row_id="a", tokens=[9], rows=[row])
    return "Verify", pb.VerifyRequest(state_id="fuzz-0", level=1, rows=[pb.VerifyRow(step=_step("a", sampling=SAMPLED),
                                                                                     proposal=proposal)])


def _dense(value: float, size: int = VOCAB) -> pb.DistributionRow:
    return pb.DistributionRow(values_fp16=np.full(size, value, dtype=np.float16).tobytes())


ONE_ROW = pb.PrefillRequest(state_id="fuzz-0", rows=_rows("a"))

test_worker_calls, test_worker_calls_long = quick_and_long(
    run_script,
    example(script=(ONE_ROW, [_draft(_step("a", cycle=2**64 - 1, sampling=SAMPLING_T1))])),   # struct.error: INTERNAL
    example(script=(ONE_ROW, [_draft(_step("a", sampling=pb.Sampling(temperature=t, top_p=1.0, repetition_penalty=1.0)))
                              for t in (1e-45, float("inf"))])),                                # NaN rows before
    example(script=(ONE_ROW, [_verify_with_row(_dense(v)) for v in (float("nan"), float("inf"), -1.0, 0.0)])),
    # a prefill without rows made a state without rows, on which a draft failed INTERNAL in the forward pass
    example(script=(pb.PrefillRequest(state_id="fuzz-0"), [_draft(window=1), ("Verify", pb.VerifyRequest(state_id="fuzz-0"))])),
    script=worker_scripts())

test_worker_raw_bytes, test_worker_raw_bytes_long = quick_and_long(
    run_raw,
    example(body=b"\x00"),               # field number 0: INTERNAL from gRPC's own parsing before
    example(body=b"\x0a\x02\xff\xfe"),   # a state id that is not UTF-8
    body=worker_raw_bodies)


MALFORMED_ROWS = {
    "dense, a value short": (_dense(0.5, VOCAB - 1), "got 8190 bytes"),
    "dense, an odd byte count": (pb.DistributionRow(values_fp16=bytes(2 * VOCAB - 1)), "got 8191 bytes"),
    "no bytes at all": (pb.DistributionRow(), "got 0 bytes"),
    "sparse, fewer indices than values": (pb.DistributionRow(values_fp16=np.ones(2, np.float16).tobytes(),
                                                             indices_int32=np.zeros(1, np.int32).tobytes()),
                                          "got 4 bytes of indices and 4 of values"),
    "sparse, an odd byte count": (pb.DistributionRow(values_fp16=np.ones(1, np.float16).tobytes(), indices_int32=b"\x01\x02\x03"),
                                  "got 3 bytes of indices"),
}


@pytest.mark.parametrize("row,words", MALFORMED_ROWS.values(), ids=MALFORMED_ROWS)
def test_a_malformed_row_is_refused_with_its_sizes(fuzzed, row, words) -> None:
    """The message says what a row must hold and what came, not the tensor library's complaint."""
    stub = fuzzed[2]
    stub.Prefill(ONE_ROW)
    try:
        code, details, _ = call(stub.Verify, _verify_with_row(row)[1])
    finally:
        stub.Release(pb.ReleaseRequest(state_id="fuzz-0"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and words in details and "fp16" in details, details
