"""The worker's gRPC server: decode the request, call the engine, encode the response."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
import torch
from grpc_health.v1 import health

from specrouter import serving
from specrouter.tls import ServerTLS
from specrouter.pool.load import load_model, parse_dtype, tokenizer_fingerprint
from specrouter.v1 import worker_pb2 as pb
from specrouter.v1 import worker_pb2_grpc
from specrouter.contract import errors, wire
from specrouter.worker import protocol
from specrouter.contract.calls import RowStep, SamplingParams, VerifyRow
from specrouter.worker.compute import ComputeLoop
from specrouter.worker.engine import EngineSettings, WorkerEngine
from specrouter.worker.forward import ModelForward
from specrouter.worker.prometheus import WorkerMetrics
from specrouter.worker.settings import WorkerSettings

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["WorkerService"].full_name
ROW_BYTES_PER_ENTRY = 2      # fp16; a row is sent sparse only when that is smaller than dense
MESSAGE_HEADROOM = 4 * 2**20


def _handle(call: Callable[[], object], context: grpc.ServicerContext):
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - mapped to a status, never leaked as a traceback
        code = errors.status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("internal error")
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            log.warning("out of memory: %s", exc)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()   # the cached blocks of the failed call go back for the next one
        if getattr(exc, "row_ids", None):   # the engine's RowError: the other rows can go on without these
            context.set_trailing_metadata(errors.failed_rows_to_metadata(exc.row_ids))
        context.abort(code, str(exc))


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, engine: WorkerEngine, info: pb.InfoResponse, compute: ComputeLoop,
                 metrics: WorkerMetrics | None = None):
        self.engine = engine
        self.info = info
        self.compute = compute   # engine operations run on its thread; decoding and encoding on the handler's
        self.metrics = metrics

    def _observe(self, operation: str, timings) -> None:
        if self.metrics is not None:
            self.metrics.observe_forwards(operation, timings)

    def Info(self, request, context):
        reply = pb.InfoResponse()
        reply.CopyFrom(self.info)
        reply.live_states = len(self.engine.state_ids())
        return reply

    def Prefill(self, request, context):
        def run():
            start = time.perf_counter_ns()
            rows = [(r.row_id, list(r.tokens)) for r in request.rows]
            result = self.compute.call(lambda: self.engine.prefill(request.state_id, rows, request.predictions))
            self._observe("prefill", result.timings)
            return pb.PrefillResponse(
                timing=wire.timing_to_pb(result.timings, time.perf_counter_ns() - start),
                predictions=[pb.PrefillPredictions(tokens=t) for t in result.tokens] if request.predictions else [])
        return _handle(run, context)

    def Draft(self, request, context):
        def run():
            start = time.perf_counter_ns()
            steps = [wire.step_from_pb(r) for r in request.rows]
            result = self.compute.call(lambda: self.engine.draft(request.state_id, request.level, request.window, steps,
                                                                  hand_up=request.hand_up))
            self._observe("draft", result.timings)
            return protocol.step_result_to_pb(result, [s.row_id for s in steps], time.perf_counter_ns() - start)
        return _handle(run, context)

    def Verify(self, request, context):
        def run():
            start = time.perf_counter_ns()
            device = self.engine.forward.device
            rows = [protocol.verify_row_from_pb(r, self.engine.vocab, device) for r in request.rows]
            result = self.compute.call(lambda: self.engine.verify(request.state_id, request.level, rows, request.hand_up))
            self._observe("verify", result.timings)
            return protocol.step_result_to_pb(result, [r.row_id for r in rows], time.perf_counter_ns() - start)
        return _handle(run, context)

    def Release(self, request, context):
        def run():
            row_ids = list(request.row_ids) or None
            self.compute.call(lambda: self.engine.release(request.state_id, row_ids))
            return pb.ReleaseResponse()
        return _handle(run, context)


def _lenient_handlers(servicer: WorkerServicer) -> grpc.GenericRpcHandler:
    """The service's methods, with a request parser that cannot fail: bytes that are no request of the method
    are refused by the handler with INVALID_ARGUMENT (gRPC's own parser would answer INTERNAL)."""
    def parser(message_type):
        def parse(data: bytes):
            try:
                return message_type.FromString(data)
            except Exception as exc:  # noqa: BLE001 - DecodeError, e.g. a string field that is not UTF-8
                return ValueError(f"request could not be decoded as a {message_type.DESCRIPTOR.full_name}: {exc}")
        return parse

    def refusing_undecodable(method):
        def handler(request, context):
            if isinstance(request, ValueError):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request))
            return method(request, context)
        return handler

    handlers = {m.name: grpc.unary_unary_rpc_method_handler(refusing_undecodable(getattr(servicer, m.name)),
                                                            parser(getattr(pb, m.input_type.name)),
                                                            lambda reply: reply.SerializeToString())
                for m in pb.DESCRIPTOR.services_by_name["WorkerService"].methods}
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def message_limit(settings: WorkerSettings, vocab: int) -> int:
    """Bytes of the largest message: a full batch of windows of dense fp16 rows, plus headroom."""
    return settings.max_batch_size * (settings.max_window + 1) * vocab * ROW_BYTES_PER_ENTRY + MESSAGE_HEADROOM


def build_engine(settings: WorkerSettings) -> tuple[WorkerEngine, pb.InfoResponse]:
    if settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads)
    model = load_model(settings.model_dir, parse_dtype(settings.dtype), settings.device)
    engine = WorkerEngine(settings.model_name, ModelForward(model, prepack=settings.prepack_weights),
                          EngineSettings(state_ttl_s=settings.state_ttl_s,
                                         compact_hole_fraction=settings.compact_hole_fraction,
                                         draft_lookahead=settings.draft_lookahead))
    info = pb.InfoResponse(
        model_name=settings.model_name, parameters=sum(p.numel() for p in model.parameters()),
        vocab_size=engine.vocab, tokenizer_sha256=tokenizer_fingerprint(settings.model_dir),
        context_length=engine.forward.context_length, device=str(engine.forward.device),
        dtype=str(engine.forward.dtype).removeprefix("torch."))
    return engine, info


def warm_up(engine: WorkerEngine, info: pb.InfoResponse, batch_sizes: Sequence[int] = (),
            tokens_per_row: Sequence[int] = (), context: int = 32) -> None:
    """One prefill, draft and verify on a throwaway state, so the first request pays no start-up cost;
    then one forward per (batch size, tokens per row) of the profile grid, recorded in `info` as the
    scheduler's latency prior for this model."""
    state = "__warmup__"
    engine.prefill(state, [("w", [1, 2, 3])])
    engine.draft(state, 0, 2, [RowStep("w", [4], SamplingParams(), 0)])
    engine.verify(state, 1, [VerifyRow("w", [5], SamplingParams(), 1, rollback=1, proposal=[6])], hand_up=False)
    engine.release(state)
    forward = engine.forward
    with torch.inference_mode():
        for b in batch_sizes:
            kv = forward.empty_state([f"w{i}" for i in range(b)])
            prompt = torch.ones(b, context, dtype=torch.long, device=forward.device)
            forward(kv, prompt, torch.ones_like(prompt, dtype=torch.bool))
            for i, k in enumerate([*tokens_per_row[:1], *tokens_per_row]):  # the first one twice: a warm pass
                block = torch.ones(b, k, dtype=torch.long, device=forward.device)
                _, timing = forward(kv, block, torch.ones_like(block, dtype=torch.bool))
                kv.rollback(torch.full((b,), k, dtype=torch.long))
                if i > 0:
                    info.warmup_forwards.add(forward_ns=timing.forward_ns, batch_size=timing.batch_size,
                                             tokens_per_row=timing.tokens_per_row, tokens_valid=timing.tokens_valid)


def create_server(settings: WorkerSettings, engine: WorkerEngine, info: pb.InfoResponse, compute: ComputeLoop,
                  tls: ServerTLS | None = None, metrics: WorkerMetrics | None = None,
                  ) -> tuple[grpc.Server, int, health.HealthServicer]:
    """The worker's server, bound (over TLS with `tls`), not started; `metrics`: the Prometheus metrics it
    keeps up to date."""
    limit = message_limit(settings, engine.vocab)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=settings.threads),
        options=[("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)],
        interceptors=[metrics.rpc] if metrics is not None else None,
    )
    server.add_generic_rpc_handlers((_lenient_handlers(WorkerServicer(engine, info, compute, metrics)),))
    health_servicer = serving.add_health_and_reflection(server, SERVICE_NAME, serving=False)  # until warmed up
    return server, serving.listen(server, settings.host, settings.port, tls), health_servicer


def worker_metrics(engine: WorkerEngine, info: pb.InfoResponse) -> WorkerMetrics:
    return WorkerMetrics(engine, {"model": info.model_name, "device": info.device, "dtype": info.dtype})


def mark_serving(health_servicer: health.HealthServicer, serving_now: bool) -> None:
    serving.set_serving(health_servicer, SERVICE_NAME, serving_now)
