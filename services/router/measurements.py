"""What the router measures each cycle, turned into profiler reports and sent off the hot path."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Sequence

import grpc
from opentelemetry import context as otel_context

from specrouter.tls import ClientTLS, channel
from specrouter.profiler.metrics import AcceptanceRate, ForwardLatency, Similarity
from specrouter.contract.measures import Mode
from specrouter.router.cycle_report import CycleReport
from specrouter.router.lookup import by_match
from specrouter.router.row import Row
from specrouter.router.scheduling.candidates import mode_of
from specrouter.router.scheduling.snapshot import Snapshot
from specrouter.v1 import profiler_pb2 as pb
from specrouter.v1 import profiler_pb2_grpc

log = logging.getLogger(__name__)
QUEUE_LIMIT = 1024  # cycles waiting to be reported; beyond it the oldest measurements are dropped
# Cycles are reported together, at most this often: one RPC (and one profiler update) per period instead
# of per cycle keeps the profiler off the cores the models need; the router reads the metrics back
# every `snapshot_refresh_s` (a second by default), so nothing it decides on is older for it.
REPORT_PERIOD_S = 0.2


def acceptance_counts(report: CycleReport, rows: Sequence[Row], shadow: bool = True, matches: bool = True,
                      ) -> dict[tuple[str, str, Mode, int], list[int]]:
    """Per (drafter, verifier, mode, draft position): [accepted, proposed] over the cycle's rows, each row's
    proposal tested up to its first rejection (so accepted / proposed at a position is the chance that a
    token there is accepted once every token before it was; `CycleReport.checked`). With `shadow`, also
    the lookup's proposals judged in a cycle that did not run it (`CycleReport.shadow`). With `matches`,
    the lookup's checks count twice: under its name and under its name with the row's match length
    (`by_match`), for the scheduler to price its chains by the match each row has."""
    chain = report.chain
    counts: dict[tuple[str, str, Mode, int], list[int]] = defaultdict(lambda: [0, 0])

    def add(drafters: Sequence[str], verifier: str, row: Row, accepted: int, checked: int) -> None:
        for drafter in drafters:
            for position in range(checked):
                c = counts[(drafter, verifier, mode_of(row), position)]
                c[0] += position < accepted
                c[1] += 1

    per_match = report.matches if matches else None

    def lookup_names(drafter: str, index: int) -> list[str]:
        return [drafter] if per_match is None else [drafter, by_match(drafter, per_match[index])]

    for level in range(1, len(chain)):
        drafter, verifier = chain[level - 1], chain[level]
        for index, (row, accepted) in enumerate(zip(rows, report.accepted[verifier])):
            names = lookup_names(drafter, index) if level == 1 and report.model_free else [drafter]
            add(names, verifier, row, accepted, report.checked(verifier, index))
    for (drafter, verifier), per_row in (report.shadow if shadow else {}).items():   # judged, not run
        for index, (row, judgement) in enumerate(zip(rows, per_row)):
            if judgement is not None:
                add(lookup_names(drafter, index), verifier, row, *judgement)
    return counts


def cycle_measurements(report: CycleReport, rows: Sequence[Row]) -> pb.ReportRequest:
    """Forward timings of every model, acceptance per (drafter, verifier, mode, position), and similarity
    per (drafter, verifier, mode) over every proposal position its verifier compared."""
    request = pb.ReportRequest()
    for model, result in report.results.items():
        for t in result.timings:
            if t.forward_ns > 0:
                request.forward.add(model=model, batch_size=t.batch_size, tokens_per_row=t.tokens_per_row,
                                    forward_ns=t.forward_ns)
    chain = report.chain
    for (drafter, verifier, mode, position), (acc, prop) in acceptance_counts(report, rows).items():
        request.acceptance.add(drafter=drafter, verifier=verifier, mode=_MODES_TO_PB[mode], position=position,
                               accepted=acc, proposed=prop)
    similar: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0])
    for level in range(1 + report.model_free, len(chain)):   # a model-free level's proposal has no distribution
        drafter, verifier = chain[level - 1], chain[level]
        sums = report.results[verifier].similarity
        for row, total, proposed in zip(rows, sums, report.proposed[verifier]):
            if proposed:
                s = similar[(drafter, verifier, _MODES_TO_PB[mode_of(row)])]
                s[0] += total
                s[1] += proposed
    for (drafter, verifier, mode), (total, positions) in similar.items():
        request.similarity.add(drafter=drafter, verifier=verifier, mode=mode, positions=positions,
                               similarity=min(1.0, max(0.0, total / positions)))
    return request


class Reporter:
    """Sends measurements to the profiler from a background thread; never blocks a cycle."""

    def __init__(self, address: str | None, timeout_s: float = 2.0, tls: ClientTLS | None = None):
        self._queue: queue.Queue[tuple[pb.ReportRequest, object] | None] = queue.Queue(QUEUE_LIMIT)
        self._stub = profiler_pb2_grpc.ProfilerServiceStub(channel(address, tls)) if address else None
        self._timeout_s = timeout_s
        self._thread = threading.Thread(target=self._run, name="profiler-reporter", daemon=True)
        self.dropped = 0

    def start(self) -> None:
        """Starts the sending thread; without a profiler there is nothing to send."""
        if self._stub is not None:
            self._thread.start()

    def observe(self, report: CycleReport, rows: Sequence[Row]) -> None:
        if self._stub is None:
            return
        try:
            self._queue.put_nowait((cycle_measurements(report, rows), otel_context.get_current()))
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            merged, ctx = pb.ReportRequest(), first[1]
            merged.MergeFrom(first[0])
            deadline, closing = time.monotonic() + REPORT_PERIOD_S, False
            while (left := deadline - time.monotonic()) > 0:   # one RPC for every cycle of the period
                try:
                    nxt = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                if nxt is None:
                    closing = True
                    break
                merged.MergeFrom(nxt[0])
            self._send(merged, ctx)
            if closing:
                return

    def _send(self, request: pb.ReportRequest, ctx) -> None:
        token = otel_context.attach(ctx)  # the report RPC joins the trace of the (first) cycle it reports
        try:
            self._stub.Report(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            self.dropped += 1
            log.warning("profiler report failed (%s): %s", exc.code(), exc.details())
        finally:
            otel_context.detach(token)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(5)


_MODES = {pb.DECODING_MODE_GREEDY: Mode.GREEDY, pb.DECODING_MODE_SAMPLING: Mode.SAMPLING,
          pb.DECODING_MODE_COUPLED: Mode.COUPLED}
_MODES_TO_PB = {mode: value for value, mode in _MODES.items()}


def snapshot_from_pb(reply: pb.SnapshotResponse) -> Snapshot:
    """The profiler's reply as the scheduler reads it; rows of a mode it does not know are left out."""
    return Snapshot(
        forward=tuple(ForwardLatency(f.model, f.batch_size_bucket, f.tokens_per_row_bucket, f.ema_forward_ns, f.samples)
                      for f in reply.forward),
        acceptance=tuple(AcceptanceRate(a.drafter, a.verifier, _MODES[a.mode], a.position, a.ema_acceptance_rate,
                                        a.accepted_total, a.proposed_total, a.samples)
                         for a in reply.acceptance if a.mode in _MODES),
        similarity=tuple(Similarity(s.drafter, s.verifier, _MODES[s.mode], s.ema_similarity, s.samples,
                                    s.positions_total)
                         for s in reply.similarity if s.mode in _MODES),
        acceptance_alpha=reply.acceptance_alpha)


class SnapshotCache:
    """The profiler's latest snapshot, refreshed in the background so that decisions never wait on it, and
    decoded once per fetch (the scheduler takes a new object for a new snapshot)."""

    def __init__(self, address: str | None, refresh_s: float = 1.0, timeout_s: float = 2.0,
                 tls: ClientTLS | None = None):
        self._stub = profiler_pb2_grpc.ProfilerServiceStub(channel(address, tls)) if address else None
        self._refresh_s, self._timeout_s = refresh_s, timeout_s
        self._latest: Snapshot | None = None
        self._fetched_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="profiler-snapshot", daemon=True)

    def start(self) -> None:
        """Starts fetching in the background; without a profiler there is no snapshot."""
        if self._stub is not None:
            self._thread.start()

    def get(self) -> tuple[Snapshot | None, float]:
        """(latest snapshot or None, seconds since it was fetched)."""
        return self._latest, time.monotonic() - self._fetched_at

    def refresh(self) -> None:
        try:
            self._latest = snapshot_from_pb(self._stub.Snapshot(pb.SnapshotRequest(), timeout=self._timeout_s))
            self._fetched_at = time.monotonic()
        except grpc.RpcError as exc:  # keep the last one; its age tells how old it is
            log.debug("profiler snapshot failed (%s)", exc.code())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._refresh_s)

    def close(self) -> None:
        self._stop.set()
