"""/metrics of real services, scraped over HTTP around requests through the router: every series is there,
and the counters move by exactly what the requests did."""

from __future__ import annotations

import time

import grpc
import pytest

from specrouter.v1 import router_pb2 as pb
from tests.metrics.conftest import DRAFTER, TARGET
from tests.metrics.scrape import delta, scrape

NEW_TOKENS = 16
WINDOW = 3
CHAIN = f"{DRAFTER},{TARGET}"
PROMPT = "def fibonacci(n):"
WAIT_S = 10.0   # bound on waiting for a background report to land (not a timing assertion)

ROUTER_SERIES = {
    "specrouter_router_generated_tokens_total", "specrouter_router_requests_in_flight",
    "specrouter_router_requests_queued", "specrouter_router_batch_size_bucket",
    "specrouter_router_cycle_duration_seconds_bucket", "specrouter_router_cycles_total",
    "specrouter_router_accepted_tokens_total", "specrouter_router_proposed_tokens_total",
    "specrouter_router_worker_call_duration_seconds_bucket", "specrouter_router_requests_finished_total",
    "specrouter_grpc_server_handled_total", "specrouter_grpc_server_handling_seconds_bucket",
    "process_resident_memory_bytes",
}
WORKER_SERIES = {"specrouter_worker_live_states", "specrouter_worker_rows", "specrouter_worker_info",
                 "specrouter_worker_forward_duration_seconds_bucket", "specrouter_grpc_server_handled_total",
                 "process_cpu_seconds_total"}
PROFILER_SERIES = {"specrouter_profiler_reports_total", "specrouter_profiler_snapshots_total",
                   "specrouter_profiler_store_up", "specrouter_profiler_store_staleness_seconds",
                   "specrouter_grpc_server_handled_total"}


def generate(stub, **fields) -> pb.GenerateResponse:
    return stub.Generate(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=NEW_TOKENS, **fields), timeout=120)


def wait_for(url: str, check, what: str):
    deadline = time.monotonic() + WAIT_S
    while not check(samples := scrape(url)):
        assert time.monotonic() < deadline, f"{what}: not within {WAIT_S} s"
        time.sleep(0.1)
    return samples


def test_every_service_prints_where_it_serves_its_metrics(router, workers, profiler):
    for service in (router, profiler, *workers.values()):
        assert service.metrics_url and service.metrics_url.endswith("/metrics"), service.name
        assert "metrics at http://" in service.log_path.read_text(), service.name


def test_every_series_is_exported(router, router_stub, workers, profiler):
    generate(router_stub, chain=CHAIN, window=WINDOW)
    assert ROUTER_SERIES <= scrape(router.metrics_url).names()
    for name, worker in workers.items():
        samples = scrape(worker.metrics_url)
        assert WORKER_SERIES <= samples.names(), name
        assert samples.total("specrouter_worker_info", model=name) == 1
    assert PROFILER_SERIES <= scrape(profiler.metrics_url).names()


def test_a_request_moves_the_router_counters_by_what_it_did(router, router_stub):
    before = scrape(router.metrics_url)
    reply = generate(router_stub, chain=CHAIN, window=WINDOW)
    after = scrape(router.metrics_url)
    cycles = reply.stats.cycles
    assert cycles > 0 and dict(reply.stats.chain_counts) == {CHAIN: cycles}
    assert delta(before, after, "specrouter_router_generated_tokens_total") == len(reply.token_ids) == NEW_TOKENS
    assert delta(before, after, "specrouter_router_cycles_total", chain=CHAIN, window=str(WINDOW)) == cycles
    assert delta(before, after, "specrouter_router_cycles_total") == cycles
    assert delta(before, after, "specrouter_router_batch_size_count") == cycles
    assert delta(before, after, "specrouter_router_batch_size_sum") == cycles   # one row a cycle
    assert delta(before, after, "specrouter_router_cycle_duration_seconds_count", chain=CHAIN) == cycles
    assert delta(before, after, "specrouter_router_requests_finished_total", finish_reason=reply.finish_reason) == 1
    assert delta(before, after, "specrouter_grpc_server_handled_total", grpc_method="Generate", grpc_code="OK") == 1
    # the drafter drafts and the target verifies once a cycle; each is prefilled once and released once
    for model, method, calls in ((DRAFTER, "Draft", cycles), (TARGET, "Verify", cycles), (DRAFTER, "Prefill", 1),
                                 (TARGET, "Prefill", 1), (DRAFTER, "Release", 1), (TARGET, "Release", 1)):
        assert delta(before, after, "specrouter_router_worker_call_duration_seconds_count", model=model,
                     method=method) == calls, (model, method)
    # acceptance of the pair: every cycle tests the first draft position; what was accepted was proposed
    pair = {"drafter": DRAFTER, "verifier": TARGET, "mode": "greedy"}
    proposed = delta(before, after, "specrouter_router_proposed_tokens_total", **pair)
    accepted = delta(before, after, "specrouter_router_accepted_tokens_total", **pair)
    assert delta(before, after, "specrouter_router_proposed_tokens_total", position="0", **pair) == cycles
    assert 0 <= accepted <= proposed <= cycles * WINDOW
    # each cycle emits what it accepted plus one token, until the length cuts the last one short
    assert accepted + cycles >= NEW_TOKENS
    assert after.value("specrouter_router_requests_in_flight") == 0
    assert after.value("specrouter_router_requests_queued") == 0


def test_a_stream_counts_its_tokens_and_the_target_alone_its_own_chain(router, router_stub):
    before = scrape(router.metrics_url)
    chunks = list(router_stub.GenerateStream(pb.GenerateRequest(prompt=PROMPT, max_new_tokens=NEW_TOKENS,
                                                                chain="target"), timeout=120))
    after = scrape(router.metrics_url)
    tokens = sum(len(c.token_ids) for c in chunks)
    cycles = chunks[-1].stats.cycles
    assert tokens == NEW_TOKENS
    assert delta(before, after, "specrouter_router_generated_tokens_total") == tokens
    assert delta(before, after, "specrouter_router_cycles_total", chain=TARGET, window="0") == cycles
    assert delta(before, after, "specrouter_router_proposed_tokens_total") == 0   # nothing to verify
    assert delta(before, after, "specrouter_grpc_server_handled_total", grpc_method="GenerateStream",
                 grpc_code="OK") == 1


def test_adaptive_cycles_carry_the_predicted_and_measured_t_eff(router, router_stub):
    before = scrape(router.metrics_url)
    reply = generate(router_stub)   # chain "auto": the scheduler predicts each cycle
    after = scrape(router.metrics_url)
    cycles = reply.stats.cycles
    assert delta(before, after, "specrouter_router_predicted_t_eff_seconds_count") == cycles
    assert delta(before, after, "specrouter_router_measured_t_eff_seconds_count") == cycles
    assert delta(before, after, "specrouter_router_predicted_t_eff_seconds_sum") > 0
    assert delta(before, after, "specrouter_router_measured_t_eff_seconds_sum") > 0
    for chain, n in reply.stats.chain_counts.items():
        assert delta(before, after, "specrouter_router_predicted_t_eff_seconds_count", chain=chain) == n


def test_refusals_are_counted_by_status(router, router_stub):
    before = scrape(router.metrics_url)
    with pytest.raises(grpc.RpcError) as refused:
        generate(router_stub, chain="no-such-model")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = scrape(router.metrics_url)
    assert delta(before, after, "specrouter_grpc_server_handled_total", grpc_method="Generate",
                 grpc_code="INVALID_ARGUMENT") == 1
    assert delta(before, after, "specrouter_router_generated_tokens_total") == 0


def test_workers_count_their_calls_and_hold_nothing_after_the_request(router_stub, workers):
    before = {name: scrape(w.metrics_url) for name, w in workers.items()}
    reply = generate(router_stub, chain=CHAIN, window=WINDOW)
    cycles = reply.stats.cycles
    for name, w in workers.items():
        after = wait_for(w.metrics_url, lambda s: s.value("specrouter_worker_live_states") == 0,
                         f"{name} still holds a state")
        assert after.value("specrouter_worker_rows") == 0
        operation, method = ("draft", "Draft") if name == DRAFTER else ("verify", "Verify")
        assert delta(before[name], after, "specrouter_grpc_server_handled_total", grpc_method=method,
                     grpc_code="OK") == cycles, name
        assert delta(before[name], after, "specrouter_worker_forward_duration_seconds_count",
                     operation=operation) >= cycles, name
        assert delta(before[name], after, "specrouter_worker_forward_duration_seconds_count",
                     operation="prefill") == 1, name
        assert delta(before[name], after, "specrouter_grpc_server_handled_total", grpc_method="Release",
                     grpc_code="OK") == 1, name


def test_the_profiler_counts_the_routers_reports_and_snapshots(router_stub, profiler):
    before = scrape(profiler.metrics_url)
    generate(router_stub, chain=CHAIN, window=WINDOW)
    after = wait_for(profiler.metrics_url,
                     lambda s: delta(before, s, "specrouter_profiler_reports_total", outcome="stored") > 0,
                     "no report from the router")
    assert delta(before, after, "specrouter_profiler_measurements_total", kind="acceptance") > 0
    assert delta(before, after, "specrouter_profiler_measurements_total", kind="forward") > 0
    assert after.total("specrouter_profiler_snapshots_total", freshness="fresh") > 0
    assert after.total("specrouter_profiler_reports_total", outcome="dropped") == 0
    assert after.value("specrouter_profiler_store_up") == 1
    assert after.value("specrouter_profiler_store_staleness_seconds") == 0
