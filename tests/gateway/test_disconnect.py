"""A client that leaves cancels its request on the router: mid-stream, and while a whole answer is being made.
The router counts the call CANCELLED, gives up its place, and the workers release the request's state."""

from __future__ import annotations

import json
import socket

import httpx

from tests.gateway.conftest import TARGET, TOKEN, released, router_calls, wait_until
from tests.metrics.scrape import scrape


def test_leaving_a_stream_cancels_the_routers_request(cluster, long_prompt) -> None:
    cancelled = router_calls(cluster, "GenerateStream", "CANCELLED")
    body = {"model": TARGET, "prompt": long_prompt, "max_tokens": 300, "temperature": 0, "stream": True,
            "chain": "target"}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"http://{cluster.gateway}/v1/completions", json=body,
                           headers={"authorization": f"Bearer {TOKEN}"}) as response:
            assert response.status_code == 200
            first = next(line for line in response.iter_lines() if line.startswith("data: "))
            assert json.loads(first.removeprefix("data: "))["choices"][0]["specrouter"]["token_ids"]
        # leaving the block closed the connection, 300 tokens before the end
    wait_until(lambda: router_calls(cluster, "GenerateStream", "CANCELLED") == cancelled + 1,
               "the router's GenerateStream ending CANCELLED")
    wait_until(lambda: released(cluster), "the router's place and the workers' states released")


def test_leaving_before_a_whole_answer_cancels_the_routers_request(cluster, long_prompt) -> None:
    cancelled = router_calls(cluster, "Generate", "CANCELLED")
    body = json.dumps({"model": TARGET, "prompt": long_prompt, "max_tokens": 300, "temperature": 0,
                       "chain": "target"}).encode()
    host, port = cluster.gateway.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
                     b"authorization: Bearer " + TOKEN.encode() + b"\r\ncontent-length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        # the request runs on the router (it holds a place) before the client leaves
        wait_until(lambda: scrape(cluster.metrics["router"]).value("specrouter_router_requests_in_flight") == 1,
                   "the request reaching the router")
    wait_until(lambda: router_calls(cluster, "Generate", "CANCELLED") == cancelled + 1,
               "the router's Generate ending CANCELLED")
    wait_until(lambda: released(cluster), "the router's place and the workers' states released")
    gone = scrape(cluster.metrics["gateway"]).value("specrouter_gateway_requests_total", route="/v1/completions",
                                                   method="POST", status="499")
    assert gone >= 1
