"""What the router measures reaches the profiler, and the router holds the profiler's latest snapshot."""

from __future__ import annotations

import time

import pytest

from specrouter.profiler.memory_store import MemoryStore
from specrouter.profiler.server import create_server
from specrouter.profiler.settings import ProfilerSettings
from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.measurements import Reporter, SnapshotCache, cycle_measurements
from specrouter.v1 import profiler_pb2 as pb
from specrouter.contract.calls import SamplingParams


def run_chain(engines, reports: list[CycleReport], rows_seen: list) -> None:
    batch = ChainBatch(engines, "t", 256)
    batch.add([Row("a", [1, 2, 3], 3, SamplingParams(), 12), Row("b", [4, 5], 2, SamplingParams(temperature=1.0), 12)])
    run_to_completion(batch, lambda _: (("s", "m", "t"), 3),
                      lambda r: (reports.append(r), rows_seen.append(list(batch.rows.values()))))


def test_cycle_measurements_count_tested_and_accepted_positions(tiny_pool) -> None:
    reports, rows = [], []
    run_chain(tiny_pool, reports, rows)
    request = cycle_measurements(reports[0], rows[0])
    assert {f.model for f in request.forward} == {"s", "m", "t"}
    pairs = {(a.drafter, a.verifier) for a in request.acceptance}
    assert pairs <= {("s", "m"), ("m", "t")} and pairs
    modes = {a.mode for a in request.acceptance}
    assert modes <= {pb.DECODING_MODE_GREEDY, pb.DECODING_MODE_SAMPLING}
    for a in request.acceptance:
        assert 0 <= a.accepted <= a.proposed
    # position 0 is tested once per row and level: proposed counts at position 0 equal the rows
    by_pair = {}
    for a in request.acceptance:
        if a.position == 0:
            by_pair[(a.drafter, a.verifier)] = by_pair.get((a.drafter, a.verifier), 0) + a.proposed
    assert all(v == 2 for v in by_pair.values())
    # similarity per pair and mode, over every proposal position the verifier compared
    sims = {(m.drafter, m.verifier, m.mode): m for m in request.similarity}
    assert set(sims) == {(d, v, mode) for d, v in [("s", "m"), ("m", "t")]
                         for mode in (pb.DECODING_MODE_GREEDY, pb.DECODING_MODE_SAMPLING)}
    report = reports[0]
    for (d, v, mode), m in sims.items():
        index = 0 if mode == pb.DECODING_MODE_GREEDY else 1   # row "a" is greedy, row "b" samples
        assert m.positions == report.proposed[v][index]
        assert abs(m.similarity - report.results[v].similarity[index] / m.positions) < 1e-9
        assert 0.0 <= m.similarity <= 1.0


def test_coupled_rows_are_measured_in_their_own_mode(tiny_pool) -> None:
    """A coupled row's acceptance and similarity (how often the two levels' picks agree) are reported as
    DECODING_MODE_COUPLED, apart from speculative sampling's."""
    batch = ChainBatch(tiny_pool, "t", 256)
    batch.add([Row("a", [1, 2, 3], 3, SamplingParams(temperature=1.0, seed=5, coupled=True), 12),
               Row("b", [4, 5], 2, SamplingParams(temperature=1.0, seed=6), 12)])
    reports, rows = [], []
    run_to_completion(batch, lambda _: (("s", "t"), 3),
                      lambda r: (reports.append(r), rows.append(list(batch.rows.values()))))
    request = cycle_measurements(reports[0], rows[0])
    assert {a.mode for a in request.acceptance} == {pb.DECODING_MODE_COUPLED, pb.DECODING_MODE_SAMPLING}
    sims = {m.mode: m for m in request.similarity}
    assert set(sims) == {pb.DECODING_MODE_COUPLED, pb.DECODING_MODE_SAMPLING}
    report = reports[0]   # a coupled row's similarity counts the positions whose picks agree: a whole number
    assert sims[pb.DECODING_MODE_COUPLED].similarity * report.proposed["t"][0] == pytest.approx(
        round(report.results["t"].similarity[0]))


def test_reports_reach_the_profiler_and_the_snapshot_comes_back(tiny_pool) -> None:
    server, port = create_server(ProfilerSettings(host="127.0.0.1", port=0), MemoryStore(0.1))
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        reporter, cache = Reporter(address), SnapshotCache(address, refresh_s=0.05)
        reporter.start()
        cache.start()
        reports, rows = [], []
        run_chain(tiny_pool, reports, rows)
        for report, seen in zip(reports, rows):
            reporter.observe(report, seen)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            snap, age = cache.get()
            if snap is not None and {f.model for f in snap.forward} == {"s", "m", "t"}:
                break
            time.sleep(0.05)
        assert snap is not None and {f.model for f in snap.forward} == {"s", "m", "t"} and age < 5
        assert sum(a.proposed_total for a in snap.acceptance) > 0
        reporter.close()
        cache.close()
    finally:
        server.stop(0)
