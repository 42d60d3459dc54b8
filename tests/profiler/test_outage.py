"""Redis going away and coming back: the profiler keeps answering and recovers."""

from __future__ import annotations

import time

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrouter.profiler.redis_store import RedisStore
from specrouter.v1 import profiler_pb2 as pb

from .reports import forward, snapshot

RECOVERY_TIMEOUT_S = 10.0


def _report(stub, forward_ns: int) -> bool:
    return stub.Report(pb.ReportRequest(forward=[forward(forward_ns)]), timeout=10).stored


def _until_fresh(stub) -> pb.SnapshotResponse:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while (response := snapshot(stub)).stale:
        assert time.monotonic() < deadline, "still stale after Redis came back"
        time.sleep(0.02)
    return response


def test_redis_outage_serves_stale_snapshots_and_recovers(redis_factory, serve, connect, key_prefix,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Redis is killed mid-run and restarted on the same port (without persistence, so it comes back empty).

    While it is down: Snapshot answers with the last values read, stale=true and a growing age; Report
    answers stored=false without an error; health stays SERVING. After the restart: stale=false, new
    reports land, and the log tells how many reports were dropped.
    """
    redis_server = redis_factory()
    address = serve(RedisStore.from_url(redis_server.url, 0.1, key_prefix, timeout_s=0.5))
    stub = connect(address)
    assert _report(stub, 1_000_000)
    before = snapshot(stub)
    assert not before.stale and before.forward[0].samples == 1 and before.reports_dropped == 0

    redis_server.kill()
    during = snapshot(stub)
    assert during.stale and during.forward == before.forward
    assert not _report(stub, 3_000_000)
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while (later := snapshot(stub)).age_ms <= during.age_ms:   # the age grows while Redis stays down
        assert time.monotonic() < deadline, "the stale snapshot's age does not grow"
        time.sleep(0.01)
    assert later.stale and later.forward == before.forward
    assert later.reports_dropped == 1
    health = connect(address, health_pb2_grpc.HealthStub).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING

    redis_server.start()
    fresh = _until_fresh(stub)
    assert fresh.age_ms == 0 and fresh.reports_dropped == 1
    assert _report(stub, 5_000_000)
    after = snapshot(stub)
    assert not after.stale
    assert [(f.samples, f.ema_forward_ns) for f in after.forward] == [(1, 5_000_000.0)]
    assert "1 report(s) were dropped while it was down" in caplog.text
