"""A worker over gRPC, with the same operations as an in-process `WorkerEngine` (the `Worker` interface).

The distribution rows a worker returns stay in their wire form: the chain hands them to the next level's
worker as the bytes it received.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import grpc

from specrouter.tls import ClientTLS, channel as open_channel
from specrouter.v1 import worker_pb2 as pb
from specrouter.v1 import worker_pb2_grpc
from specrouter.contract import wire
from specrouter.contract.calls import RowStep, StepResult, VerifyRow

MAX_MESSAGE_BYTES = 256 * 2**20  # the worker enforces its own, smaller limit
# a worker that restarts is found again within this (gRPC's own reconnect backoff grows to 120 s)
MAX_RECONNECT_BACKOFF_MS = 2000
# after each call: (model, method, seconds, status code name)
CallObserver = Callable[[str, str, float, str], None]


class RemoteWorker:
    remote = True   # its calls run in another process: calls to several workers may overlap

    def __init__(self, address: str, channel: grpc.Channel | None = None, timeout_s: float = 60.0,
                 tls: ClientTLS | None = None, wait_s: float | None = None, server_name: str | None = None):
        """Connects and asks the worker's Info, waiting up to `wait_s` (default `timeout_s`) for it to answer.
        `server_name`: the name its TLS certificate must carry, where `address` is an IP address its name
        resolved to."""
        self.address = address
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS)]
        if tls is not None and server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        self.channel = channel or open_channel(address, tls, options=options)
        self.stub = worker_pb2_grpc.WorkerServiceStub(self.channel)
        self.timeout_s = timeout_s
        try:
            self.info = wire.info_from_pb(self.stub.Info(pb.InfoRequest(), timeout=wait_s or timeout_s,
                                                         wait_for_ready=True))
        except grpc.RpcError:
            if channel is None:
                self.channel.close()
            raise
        self.name = self.info.model_name
        self.calls = self.bytes_sent = self.bytes_received = 0  # traffic counters, for benchmarks
        self.observe_call: CallObserver | None = None

    def probe(self, timeout_s: float = 2.0) -> None:
        """Raises unless the worker answers (its Info), as after a restart at the same address."""
        self.stub.Info(pb.InfoRequest(), timeout=min(timeout_s, self.timeout_s))

    def _call(self, method: str, request):
        started, code = time.perf_counter(), "OK"
        try:
            reply = getattr(self.stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
            raise
        finally:
            if self.observe_call is not None:
                self.observe_call(self.name, method, time.perf_counter() - started, code)
        self.calls += 1
        self.bytes_sent += request.ByteSize()
        self.bytes_received += reply.ByteSize()
        return reply

    def prefill(self, state_id: str, rows: Sequence[tuple[str, Sequence[int]]], predictions: int = 0) -> StepResult:
        reply = self._call("Prefill", pb.PrefillRequest(state_id=state_id, predictions=predictions, rows=[
            pb.PrefillRow(row_id=r, tokens=list(t)) for r, t in rows]))
        guesses = [list(p.tokens) for p in reply.predictions] if predictions else [[] for _ in rows]
        return StepResult(tokens=guesses, rows=[None] * len(rows), timings=wire.timings_from_pb(reply.timing.forwards))

    def draft(self, state_id: str, level: int, window: int, rows: Sequence[RowStep], hand_up: bool = True) -> StepResult:
        reply = self._call("Draft", pb.DraftRequest(state_id=state_id, level=level, window=window, hand_up=hand_up,
                                                    rows=[wire.step_to_pb(r) for r in rows]))
        return wire.step_result_from_pb(reply, verify=False)

    def verify(self, state_id: str, level: int, rows: Sequence[VerifyRow], hand_up: bool) -> StepResult:
        reply = self._call("Verify", pb.VerifyRequest(state_id=state_id, level=level, hand_up=hand_up,
                                                      rows=[wire.verify_row_to_pb(r) for r in rows]))
        return wire.step_result_from_pb(reply, verify=True)

    def release(self, state_id: str, row_ids: Sequence[str] | None = None) -> None:
        self._call("Release", pb.ReleaseRequest(state_id=state_id, row_ids=list(row_ids or [])))

    def close(self) -> None:
        self.channel.close()
