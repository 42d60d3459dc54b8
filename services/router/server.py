"""The router's gRPC server: read the request (`requests.RequestParser`), admit it, hand it to the batcher,
stream its tokens back. `Router` wires the pool's parts together: the batcher with its chain chooser
(`chain_choice.py`) and its cycles' observers (`cycle_observers.py`)."""

from __future__ import annotations

import logging
import queue
from collections.abc import Iterator
from concurrent import futures

import grpc
from grpc_health.v1 import health
from opentelemetry import trace

from specrouter import serving
from specrouter.tls import ClientTLS, ServerTLS
from specrouter.router.auth import BearerTokenInterceptor
from specrouter.router.admission import Admission, Overloaded, Place
from specrouter.pool.load import load_tokenizer, tokenizer_fingerprint
from specrouter.router.batcher import Batcher
from specrouter.router.chain_choice import DefaultChain, RouterChooser
from specrouter.router.cycle_observers import PrometheusCycles, ProfilerReports, SchedulerFeedback
from specrouter.router.handles import CancelledError, Emitted, Failed, Finished, RequestHandle
from specrouter.router.failures import OutOfMemory, RowFailed, WorkerCallFailed, worker_gone
from specrouter.router.health import ModelUnavailable
from specrouter.router.lookup import LOOKUP, LookupProposer
from specrouter.router.measurements import Reporter, SnapshotCache
from specrouter.router.pipelining import PipelineGate
from specrouter.router.prometheus import RouterMetrics
from specrouter.router.remote import RemoteWorker
from specrouter.router.replicas import PoolMismatch, ReplicaSet, WorkerAddress
from specrouter.pool.similarity import load_similarity
from specrouter.contract.measures import Mode
from specrouter.router.scheduling.scheduler import Scheduler
from specrouter.router.requests import InvalidRequest, RequestParser, parse_chain
from specrouter.router.settings import RouterSettings
from specrouter.router.workers import computes_on_this_hosts_cpu
from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RouterService"].full_name
MAX_SCHEDULE_ROWS = 4096
GRPC_MESSAGE_BYTES = 4 << 20     # gRPC's default bound on a received message
REQUEST_OVERHEAD_BYTES = 64 << 10   # a request's fields other than the prompt (stop strings, chain, ...)


def status_for(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The one place where the router's errors become gRPC status codes."""
    if isinstance(exc, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, CancelledError):
        return grpc.StatusCode.CANCELLED, str(exc)
    if isinstance(exc, (Overloaded, OutOfMemory)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, ModelUnavailable):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, RowFailed):   # a request that ended alone carries its own status
        return exc.code, str(exc)
    model = None
    if isinstance(exc, WorkerCallFailed):
        model, exc = exc.model, exc.cause
    worker = "a worker" if model is None else f"the worker of {model}"
    if worker_gone(exc):
        details = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
        return grpc.StatusCode.UNAVAILABLE, f"{worker} is unavailable: {details}"
    if isinstance(exc, grpc.RpcError):
        return grpc.StatusCode.INTERNAL, f"{worker} failed: {exc.code().name}: {exc.details()}"
    prefix = "" if model is None else f"{worker} failed: "
    return grpc.StatusCode.INTERNAL, f"{prefix}{type(exc).__name__}: {exc}"


class Router:
    """The pool as the router sees it: the workers' replicas, tokenizer, target, and the parts that run in the
    background (the batcher's loop and worker probes, finding replicas, the scheduler's planner, the profiler's
    reports and snapshots). `start` starts them, `close` stops them in order: the batcher first, so no cycle
    runs against a part that has stopped; the replicas' channels last."""

    def __init__(self, settings: RouterSettings, replicas: ReplicaSet, upstream: ClientTLS | None = None):
        self.settings = settings
        self.replicas = replicas
        # each model as its first replica describes it (the others agree: replicas.py)
        workers = {m: replicas.reference(m) for m in replicas.models}
        self.tokenizer = load_tokenizer(settings.tokenizer_dir)
        fingerprint = tokenizer_fingerprint(settings.tokenizer_dir)
        differ = [n for n, w in workers.items() if w.info.tokenizer_sha256 != fingerprint]
        if differ:
            raise PoolMismatch(f"workers {differ} do not use the tokenizer in {settings.tokenizer_dir}; every model "
                               "of a pool must share the target's tokenizer")
        sizes = {n: w.info.parameters for n, w in workers.items()}
        self.by_size = sorted(workers, key=sizes.__getitem__)
        self.target = settings.target or self.by_size[-1]
        if self.target not in workers:
            raise PoolMismatch(f"target {self.target!r} is not served by any worker ({self.by_size})")
        self.context_length = min(w.info.context_length for w in workers.values())
        self.admission = Admission(settings.max_in_flight, settings.max_queued)
        self.prometheus = RouterMetrics(self.admission)   # served at /metrics by the router's main
        replicas.on_join(self._observe)
        self.levels = ({LOOKUP: LookupProposer(recent_tokens=settings.lookup_recent_tokens)}   # levels with no model
                       if settings.lookup else {})
        self.chain_names = [*self.levels, *self.by_size]
        default = parse_chain(settings.default_chain, self.chain_names, self.target,
                              self.levels) if settings.default_chain else None
        self.default_chain = default or ((self.by_size[0], self.target) if len(workers) > 1 else (self.target,))
        self.parser = RequestParser(settings, self.tokenizer, self.context_length, self.chain_names, self.target,
                                    self.levels)
        self.reporter = Reporter(settings.profiler or None, tls=upstream)
        self.metrics = SnapshotCache(settings.profiler or None, settings.snapshot_refresh_s, tls=upstream)
        warmup = {n: [(f.batch_size, f.tokens_per_row, f.forward_ns) for f in w.info.warmup_forwards]
                  for n, w in workers.items()}
        offline = load_similarity(settings.pool_dir) if settings.pool_dir else []
        self.scheduler = Scheduler(self.by_size, self.target, settings.scheduler, lambda: self.metrics.get()[0],
                                   warmup, offline, levels=list(self.levels))
        # the scheduling policy: the scheduler's choice, or the default chain and window
        self.chooser: RouterChooser = (self.scheduler if settings.adaptive
                                       else DefaultChain(self.default_chain, settings.default_window))
        observers = [ProfilerReports(self.reporter), PrometheusCycles(self.prometheus, self.chooser),
                     SchedulerFeedback(self.scheduler, self.chooser)]
        self.batcher = Batcher(replicas, self.target, self.context_length, self.tokenizer.eos_token_id,
                               chooser=self.chooser, observers=observers, decode=self.tokenizer.decode,
                               prompt_positions=settings.scheduler.prompt_positions if settings.adaptive else 0,
                               target_wait_s=settings.target_wait_s, levels=self.levels,
                               pipelined=PipelineGate() if settings.pipelined == "auto"
                               else settings.pipelined == "always",
                               lookup_fallback_window=settings.lookup_fallback_window,
                               prefill_recent_cycles=settings.prefill_recent_cycles)

    def start(self) -> None:
        self.replicas.start()
        self.reporter.start()
        self.metrics.start()
        # the models' passes run on this machine's cores where the router holds them or a worker on the CPU
        # answers on this host: a planning thread there would run beside the passes
        here = self.settings.models_in_process or any(
            computes_on_this_hosts_cpu(self.replicas.reference(m)) for m in self.replicas.models)
        self.scheduler.start(passes_here=here)
        self.batcher.start()

    def close(self) -> None:
        self.batcher.stop()
        self.scheduler.close()
        self.reporter.close()
        self.metrics.close()
        self.replicas.close()

    def _observe(self, worker: RemoteWorker) -> None:
        worker.observe_call = self.prometheus.observe_worker_call


def schedule_pb(scheduler: Scheduler, greedy: int, sampling: int) -> pb.ScheduleResponse:
    """The scheduler's ranking for a batch composition, its estimates and its ledgers, on the wire."""
    plan = scheduler.plan(greedy, sampling)
    reply = pb.ScheduleResponse(
        candidates=[pb.CandidatePrediction(chain=p.chain, window=p.window, predicted_t_eff_ms=p.t_eff_ns / 1e6,
                                           predicted_cycle_ms=p.cost_ns / 1e6, predicted_emitted=p.emitted)
                    for p in plan.predictions],
        decisions=scheduler.counts["decisions"], explorations=scheduler.counts["explorations"],
        switches=scheduler.counts["switches"], decision_us=scheduler.decision_ns.get() / 1e3,
        cycle_ms=scheduler.cycle_ns.get() / 1e6, plans=scheduler.counts["plans"],
        planning_ms=scheduler.planning_ns / 1e6, stand_ins=scheduler.counts["stand_ins"])
    est = plan.estimates
    depth = max(scheduler.settings.windows)
    modes = [m for m, n in ((Mode.GREEDY, greedy), (Mode.SAMPLING, sampling)) if n]
    for d, v in scheduler.pairs:
        for mode in modes:
            pair = (d, v, mode)
            entry = reply.pairs.add(drafter=d, verifier=v, mode=mode.value, prior=est.prior(pair),
                                    rates=est.rates(pair, depth)[:depth])
            if est.similarity(pair) is not None:
                entry.similarity = est.similarity(pair)
            if est.pair_acceptance(pair) is not None:
                entry.realized = est.pair_acceptance(pair)
            if pair in est.live_similarity:
                entry.live_similarity = est.live_similarity[pair]
    for mode, c in est.calibration.items():
        reply.calibration.add(mode=mode.value, intercept=c.intercept, slope=c.slope, pairs=c.pairs)
    for (chain, window, batch, adaptive), ledger in scheduler.ledgers.items():
        entry = reply.ledgers.add(chain=chain, window=window, batch_size=batch, adaptive=adaptive,
                                  cycles=ledger.cycles, cycle_ms=ledger.cycle_ns / 1e6, emitted=ledger.emitted,
                                  predicted_cycle_ms=ledger.predicted_cycle_ns / 1e6,
                                  predicted_emitted=ledger.predicted_emitted)
        for (d, v, mode), tally in list(ledger.pairs.items()):
            entry.pairs.add(drafter=d, verifier=v, mode=mode.value, accepted=tally.accepted, checked=tally.checked,
                            predicted_accepted=tally.predicted_accepted, predicted_checked=tally.predicted_checked)
    return reply


def _stats_pb(stats: dict) -> pb.GenerationStats:
    b = stats["breakdown"]

    def timing(t) -> pb.LevelTiming:
        return pb.LevelTiming(calls=t.calls, call_ns=t.call_ns, handler_ns=t.handler_ns, forward_ns=t.forward_ns)

    breakdown = pb.CycleBreakdown(cycle_ns=b.cycle_ns, choose_ns=b.choose_ns, prefill_ns=b.prefill_ns,
                                  levels={m: timing(t) for m, t in b.levels.items()}, ahead=timing(b.ahead),
                                  cycles_from_ahead=b.cycles_from_ahead, late_prefill_ns=b.late_prefill_ns)
    return pb.GenerationStats(**{**stats, "breakdown": breakdown})


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    def __init__(self, router: Router):
        self.router = router

    def _submit(self, request, context) -> tuple[RequestHandle, Place]:
        """The request validated, admitted (after a wait in line, if the router is full) and handed to the
        batcher; the place it holds is given up when the call ends, however it ends."""
        if isinstance(request, Undecodable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"request could not be decoded ({request.error}); send the prompt as valid UTF-8")
        try:
            generation = self.router.parser.parse(request)
            place = self.router.admission.enter(context.is_active)
        except (InvalidRequest, Overloaded) as exc:
            context.abort(*status_for(exc))
        if place is None or not context.add_callback(place.release):
            if place is not None:
                place.release()
            context.abort(grpc.StatusCode.CANCELLED, "the call ended while the request waited for a place")
        span = trace.get_current_span()
        span.set_attribute("specrouter.prompt_tokens", len(generation.prompt_ids))
        handle = self.router.batcher.submit(generation, span.get_span_context())
        context.add_callback(handle.cancel)  # client cancellation and deadlines release the request
        return handle, place

    def _events(self, handle: RequestHandle, context) -> Iterator[Emitted | Finished]:
        while True:
            try:
                event = handle.events.get(timeout=1.0)
            except queue.Empty:
                if not context.is_active():
                    handle.cancel()
                    return
                continue
            if isinstance(event, Failed):
                code, message = status_for(event.error)
                context.abort(code, message)
            if isinstance(event, Finished):
                self.router.prometheus.finished.labels(event.finish_reason).inc()
            yield event
            if isinstance(event, Finished):
                return

    def Generate(self, request, context):
        handle, place = self._submit(request, context)
        try:
            for event in self._events(handle, context):
                if isinstance(event, Finished):
                    return pb.GenerateResponse(text=self.router.tokenizer.decode(event.token_ids),
                                               token_ids=event.token_ids, finish_reason=event.finish_reason,
                                               stats=_stats_pb(event.stats))
            return pb.GenerateResponse()
        finally:
            place.release()

    def GenerateStream(self, request, context):
        handle, place = self._submit(request, context)
        tokens: list[int] = []
        sent = 0
        try:
            for event in self._events(handle, context):
                if isinstance(event, Emitted):
                    tokens += event.token_ids
                    text = self.router.tokenizer.decode(tokens)
                    ready = len(text) if not text.endswith("\ufffd") else len(text.rstrip("\ufffd"))
                    yield pb.GenerateChunk(text=text[sent:ready], token_ids=event.token_ids)
                    sent = max(sent, ready)
                else:
                    text = self.router.tokenizer.decode(event.token_ids)
                    yield pb.GenerateChunk(text=text[sent:], finish_reason=event.finish_reason,
                                           stats=_stats_pb(event.stats))
        finally:
            place.release()

    def ListModels(self, request, context):
        _refuse_undecodable(request, context)
        r = self.router
        return pb.ListModelsResponse(models=[
            pb.ModelInfo(name=n, parameters=r.replicas.reference(n).info.parameters,
                         role="target" if n == r.target else "draft",
                         address=",".join(r.replicas.addresses(n)))
            for n in r.by_size], levels=[pb.ModelInfo(name=n, parameters=0, role="lookup") for n in r.levels])

    def Schedule(self, request, context):
        _refuse_undecodable(request, context)
        greedy, sampling = request.greedy_rows, request.sampling_rows
        if greedy + sampling == 0:
            greedy = 1
        if greedy + sampling > MAX_SCHEDULE_ROWS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"greedy_rows + sampling_rows is {greedy + sampling}; ask for at most {MAX_SCHEDULE_ROWS} rows")
        with self.router.scheduler.lock:
            return schedule_pb(self.router.scheduler, greedy, sampling)


class Undecodable:
    """Stands for a request whose bytes did not parse (gRPC itself treats None as INTERNAL)."""

    def __init__(self, error: Exception, message_name: str):
        self.error = error
        self.message_name = message_name


def _refuse_undecodable(request, context) -> None:
    if isinstance(request, Undecodable):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request could not be decoded ({request.error}); send a "
                      f"serialized {request.message_name}")


def _lenient(message_type):
    """A request deserializer that never fails, so that bad bytes get INVALID_ARGUMENT from the handler."""
    def parse(data: bytes):
        try:
            return message_type.FromString(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError, e.g. invalid UTF-8 in a string field
            return Undecodable(exc, message_type.DESCRIPTOR.full_name)
    return parse


def create_server(settings: RouterSettings, router: Router, tls: ServerTLS | None = None, token: str | None = None,
                  ) -> tuple[grpc.Server, int, health.HealthServicer]:
    """The router's server, bound (over TLS with `tls`), not started; with `token`, RouterService calls
    must carry it (auth.py)."""
    threads = settings.server_threads()
    # every request generating or waiting holds a thread; calls beyond twice the threads are refused by
    # gRPC itself (RESOURCE_EXHAUSTED) rather than queued without bound in front of the threads
    interceptors = [BearerTokenInterceptor(SERVICE_NAME, token)] if token else []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), maximum_concurrent_rpcs=2 * threads,
                         interceptors=[router.prometheus.rpc, *interceptors],
                         options=[("grpc.max_receive_message_length",
                                   max(GRPC_MESSAGE_BYTES, settings.max_prompt_bytes + REQUEST_OVERHEAD_BYTES))])
    servicer = RouterServicer(router)
    ser = lambda m: m.SerializeToString()  # noqa: E731
    handlers = {
        "Generate": grpc.unary_unary_rpc_method_handler(servicer.Generate, _lenient(pb.GenerateRequest), ser),
        "GenerateStream": grpc.unary_stream_rpc_method_handler(servicer.GenerateStream,
                                                               _lenient(pb.GenerateRequest), ser),
        "ListModels": grpc.unary_unary_rpc_method_handler(servicer.ListModels, _lenient(pb.ListModelsRequest), ser),
        "Schedule": grpc.unary_unary_rpc_method_handler(servicer.Schedule, _lenient(pb.ScheduleRequest), ser),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    health_servicer = serving.add_health_and_reflection(server, SERVICE_NAME, serving=True)
    return server, serving.listen(server, settings.host, settings.port, tls), health_servicer


def connect_workers(settings: RouterSettings, upstream: ClientTLS | None = None) -> ReplicaSet:
    """Every replica that `settings.workers` names, each connected and its model known (replicas.py); once
    the router starts, names are resolved again every `workers_resolve_s`. Over TLS a replica dialled at an
    address its entry's name resolved to is checked against that name, as the entry itself would be."""
    def connect(address: str, entry: WorkerAddress, wait_s: float) -> RemoteWorker:
        return RemoteWorker(address, timeout_s=settings.worker_timeout_s, tls=upstream, wait_s=wait_s,
                            server_name=None if entry.literal else entry.host)

    return ReplicaSet.open(settings.workers, connect, settings.worker_timeout_s, settings.workers_resolve_s)
