"""The router's Prometheus metrics: tokens, requests, cycles (chain, window, batch size, latency),
acceptance per pair and draft position, the scheduler's predicted against the measured T_eff, the line at
admission, and the round trips to the workers. docs/deployment.md lists them with PromQL to read them."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specrouter.prometheus import LATENCY_BUCKETS_S, RpcMetrics, new_registry
from specrouter.router.admission import Admission
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import FINISH_LENGTH, FINISH_STOP, Row
from specrouter.router.measurements import acceptance_counts
from specrouter.router.scheduling.cycle_cost import Prediction

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# seconds per emitted token: a small model on a GPU to a large one on the CPU
T_EFF_BUCKETS_S = (5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
PAIR = ["drafter", "verifier", "mode", "position"]


def mode_label(greedy: bool) -> str:
    return "greedy" if greedy else "sampling"


class RouterMetrics:
    def __init__(self, admission: Admission, registry: CollectorRegistry | None = None):
        r = self.registry = registry or new_registry()
        self.rpc = RpcMetrics(r)   # requests by method and status: specrouter_grpc_server_handled_total
        self.tokens = Counter("specrouter_router_generated_tokens", "Tokens handed to requests (after stops)",
                              registry=r)
        self.finished = Counter("specrouter_router_requests_finished", "Requests that ran to their end, by "
                                "finish reason (stop: EOS or a stop string; length)", ["finish_reason"], registry=r)
        for reason in (FINISH_STOP, FINISH_LENGTH):   # every series from the start, at 0
            self.finished.labels(reason)
        self.cycles = Counter("specrouter_router_cycles", "Cycles run, by chain and draft window (0 for the "
                              "target alone, which samples its own block of tokens)", ["chain", "window"], registry=r)
        self.accepted = Counter("specrouter_router_accepted_tokens", "Draft tokens a verifier accepted, by pair, "
                                "decoding mode and draft position", PAIR, registry=r)
        self.proposed = Counter("specrouter_router_proposed_tokens", "Draft tokens a verifier tested (up to a row's "
                                "first rejection), by pair, decoding mode and draft position", PAIR, registry=r)
        self.predicted_t_eff = Histogram("specrouter_router_predicted_t_eff_seconds", "The scheduler's expected "
                                         "wall time per emitted token of the cycles it chose, by chain", ["chain"],
                                         buckets=T_EFF_BUCKETS_S, registry=r)
        self.measured_t_eff = Histogram("specrouter_router_measured_t_eff_seconds", "Wall time per token a row "
                                        "emitted, of the same cycles, by chain", ["chain"], buckets=T_EFF_BUCKETS_S,
                                        registry=r)
        self.batch_size = Histogram("specrouter_router_batch_size", "Rows in a cycle", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.cycle_seconds = Histogram("specrouter_router_cycle_duration_seconds", "Wall time of a cycle (the "
                                       "choice of chain included), by chain", ["chain"], buckets=LATENCY_BUCKETS_S,
                                       registry=r)
        self.worker_call_seconds = Histogram("specrouter_router_worker_call_duration_seconds", "Round trip of a "
                                             "call to a worker, by model and method", ["model", "method"],
                                             buckets=LATENCY_BUCKETS_S, registry=r)
        self.worker_call_failures = Counter("specrouter_router_worker_call_failures", "Calls to a worker that "
                                            "failed, by model, method and status code", ["model", "method", "code"],
                                            registry=r)
        Gauge("specrouter_router_requests_in_flight", "Requests holding a place (generating)",
              registry=r).set_function(lambda: admission.counts()[0])
        Gauge("specrouter_router_requests_queued", "Requests waiting for a place (max_queued bounds them)",
              registry=r).set_function(lambda: admission.counts()[1])

    def observe_cycle(self, report: CycleReport, rows: Sequence[Row], cycle_ns: int,
                      prediction: Prediction | None = None) -> None:
        """One cycle that ran: its chain and window, rows, time, acceptance, and T_eff beside the prediction
        it was chosen on (cycles that had one)."""
        chain = ",".join(report.chain)
        self.cycles.labels(chain, str(report.window) if len(report.chain) > 1 else "0").inc()
        self.batch_size.observe(len(rows))
        self.cycle_seconds.labels(chain).observe(cycle_ns / 1e9)
        # the checks that ran (the lookup's judged-without-running ones go to the profiler alone)
        counts = acceptance_counts(report, rows, shadow=False, matches=False)
        for (drafter, verifier, greedy, position), (accepted, proposed) in counts.items():
            labels = (drafter, verifier, mode_label(greedy), str(position))
            self.accepted.labels(*labels).inc(accepted)
            self.proposed.labels(*labels).inc(proposed)
        emitted = sum(len(report.emitted.get(r.row_id, ())) for r in rows)
        if prediction is not None and emitted and tuple(prediction.chain) == tuple(report.chain):
            self.predicted_t_eff.labels(chain).observe(prediction.t_eff_ns / 1e9)
            self.measured_t_eff.labels(chain).observe(cycle_ns / 1e9 * len(rows) / emitted)

    def observe_worker_call(self, model: str, method: str, seconds: float, code: str) -> None:
        self.worker_call_seconds.labels(model, method).observe(seconds)
        if code != "OK":
            self.worker_call_failures.labels(model, method, code).inc()
