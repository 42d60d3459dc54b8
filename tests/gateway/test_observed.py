"""The gateway's span is the root of a request's trace, the router's and the workers' spans under it; its
requests, latencies and time to the first byte are on its /metrics."""

from __future__ import annotations

import time

from tests.gateway.conftest import WAIT_S, TARGET
from tests.metrics.scrape import scrape

GENERATE = "/specrouter.v1.RouterService/Generate"


def test_the_gateways_span_is_the_root_of_the_requests_trace(cluster, openai_client) -> None:
    receiver = cluster.traces
    # every earlier request of the session has ended and its spans have come (a stream a client left ends,
    # and sends its root span, when the gateway notices): the spans after `before` are this request's
    deadline = time.monotonic() + WAIT_S
    in_flight = "specrouter_gateway_requests_in_flight"
    while scrape(cluster.metrics["gateway"]).value(in_flight) and time.monotonic() < deadline:
        time.sleep(0.1)
    before = receiver.settled("specrouter-gateway", quiet_s=1.0, wait_s=WAIT_S)
    openai_client.completions.create(model=TARGET, prompt="def trace(x):", max_tokens=4, temperature=0)
    deadline = time.monotonic() + WAIT_S
    while True:   # spans arrive in batches from each service
        with receiver.lock:
            spans = receiver.spans[before:]
        roots = [s for s in spans if s.service == "specrouter-gateway" and s.name == "POST /v1/completions"]
        trace = [s for s in spans if roots and s.trace_id == roots[0].trace_id]
        services = {s.service for s in trace}
        names = {s.name for s in trace}   # the router's call span ends (and is sent) after its inner spans
        if (GENERATE in names and f"specrouter-worker-{TARGET}" in services) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(roots) == 1 and roots[0].parent_span_id == b"", roots
    [generate] = [s for s in trace if s.name == GENERATE]
    assert generate.parent_span_id == roots[0].span_id and generate.service == "specrouter-router"
    assert f"specrouter-worker-{TARGET}" in services, services


def test_requests_and_latencies_are_on_the_gateways_metrics(cluster, openai_client) -> None:
    url = cluster.metrics["gateway"]
    labels = dict(route="/v1/completions", method="POST", status="200")
    before = scrape(url)
    openai_client.completions.create(model=TARGET, prompt="x = ", max_tokens=2, temperature=0)
    openai_client.models.list()
    after = scrape(url)
    assert after.value("specrouter_gateway_requests_total", **labels) == \
        before.value("specrouter_gateway_requests_total", **labels) + 1
    for histogram in ("specrouter_gateway_request_duration_seconds", "specrouter_gateway_first_byte_seconds"):
        count = f"{histogram}_count"
        assert after.value(count, route="/v1/completions") == before.value(count, route="/v1/completions") + 1
        assert after.value(f"{histogram}_sum", route="/v1/completions") > \
            before.value(f"{histogram}_sum", route="/v1/completions")
    assert after.value("specrouter_gateway_requests_total", route="/v1/models", method="GET", status="200") >= 1
    assert after.value("specrouter_gateway_requests_in_flight") == 0
