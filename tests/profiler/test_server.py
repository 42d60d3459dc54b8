"""The server's contract: bad input is refused with a useful message, health, reflection, the entry point."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from specrouter.profiler.server import SERVICE_NAME
from specrouter.v1 import profiler_pb2 as pb

from .reports import acceptance, forward, similarity, snapshot

# Each report gets a good forward measurement inserted first (so a bad forward measurement is forward[1]).
BAD_REPORTS = {
    "negative forward_ns": (pb.ReportRequest(forward=[forward(-5)]),
                            ["forward[1]", "forward_ns", "got -5", "nanoseconds"]),
    "unset batch_size": (pb.ReportRequest(forward=[forward(10, batch_size=0)]),
                         ["forward[1]", "batch_size", "got 0"]),
    "accepted > proposed": (pb.ReportRequest(acceptance=[acceptance(1, 2), acceptance(5, 3)]),
                            ["acceptance[1]", "accepted (5)", "proposed (3)"]),
    "no proposals": (pb.ReportRequest(acceptance=[acceptance(0, 0)]),
                     ["acceptance[0]", "proposed must be >= 1"]),
    "unset mode": (pb.ReportRequest(acceptance=[acceptance(1, 2, mode=pb.DECODING_MODE_UNSPECIFIED)]),
                   ["acceptance[0]", "DECODING_MODE_GREEDY, DECODING_MODE_SAMPLING or DECODING_MODE_COUPLED"]),
    "similarity out of range": (pb.ReportRequest(similarity=[similarity(1.5)]),
                                ["similarity[0]", "[0.0, 1.0]", "got 1.5"]),
    "pair of one model": (pb.ReportRequest(similarity=[similarity(0.5, drafter="t", verifier="t")]),
                          ["similarity[0]", "two different models"]),
    "missing model name": (pb.ReportRequest(forward=[forward(10, model="")]), ["forward[1]", "model name"]),
}


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_bad_report_is_invalid_argument_and_records_nothing(kind, make_store, serve, connect) -> None:
    stub = connect(serve(make_store(kind)))
    for name, (bad, phrases) in BAD_REPORTS.items():
        # a good measurement ahead of the bad one: the whole report is refused, so it must not land either
        request = pb.ReportRequest(forward=[forward(1_000, model="good")])
        request.MergeFrom(bad)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Report(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        for phrase in phrases:
            assert phrase in refused.value.details(), f"{name}: {phrase!r} not in {refused.value.details()!r}"
    assert snapshot(stub).forward == []
    assert stub.Report(pb.ReportRequest(forward=[forward(1_000)]), timeout=10).stored
    assert [f.samples for f in snapshot(stub).forward] == [1]


def test_health_is_serving_and_reflection_lists_the_services(make_store, serve, connect) -> None:
    address = serve(make_store("memory"))
    health = connect(address, health_pb2_grpc.HealthStub)
    for service in ("", SERVICE_NAME):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    reflect = connect(address, reflection_pb2_grpc.ServerReflectionStub)
    [reply] = reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                           timeout=10)
    names = {s.name for s in reply.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


def test_main_serves_until_sigterm(connect) -> None:
    """`python -m specrouter.profiler` serves with the in-memory store and exits 0 on SIGTERM."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECROUTER_PROFILER_")}
    process = subprocess.Popen([sys.executable, "-m", "specrouter.profiler", "--host", "127.0.0.1",
                                "--port", str(port)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        health = connect(f"127.0.0.1:{port}", health_pb2_grpc.HealthStub)
        reply = health.Check(health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        out, _ = process.communicate()
    assert f"profiler listening on 127.0.0.1:{port}" in out
