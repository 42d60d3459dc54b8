"""Reports from many routers at once lose no update."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from specrouter.profiler.memory_store import MemoryStore
from specrouter.v1 import profiler_pb2 as pb

from .reports import SAMPLING, acceptance, forward, similarity, snapshot, without_age

CLIENTS = 6
REPORTS_PER_CLIENT = 25


def _report() -> pb.ReportRequest:
    return pb.ReportRequest(
        forward=[forward(2_000_000, batch_size=4, tokens_per_row=5)],
        acceptance=[acceptance(3, 4, position=0), acceptance(2, 3, position=1, mode=SAMPLING)],
        similarity=[similarity(0.625)],
    )


def test_concurrent_reports_lose_no_update(make_store, serve, connect) -> None:
    """Six clients, each on its own channel, report at once through two profiler replicas that share one
    Redis prefix: with two replicas (two stores, two connection pools) only Redis's own atomicity keeps
    updates apart, not a lock inside one process.

    An EMA depends on the order of its updates, so every report here is the same one: the state after n
    reports then depends on n alone, and both replicas must answer, bit for bit, the snapshot that one
    in-memory store reaches by applying the n reports one after another. A lost update would show up as
    fewer `samples`, smaller totals, and a different EMA.
    """
    replicas = [serve(make_store("redis"), max_workers=CLIENTS) for _ in range(2)]
    start = threading.Barrier(CLIENTS)

    def client(i: int) -> list[bool]:
        stub = connect(replicas[i % 2])
        start.wait()
        return [stub.Report(_report(), timeout=10).stored for _ in range(REPORTS_PER_CLIENT)]

    with ThreadPoolExecutor(CLIENTS) as pool:
        stored = [s for reports in pool.map(client, range(CLIENTS)) for s in reports]
    assert len(stored) == CLIENTS * REPORTS_PER_CLIENT and all(stored)

    sequential = connect(serve(MemoryStore(0.1)))
    for _ in stored:
        assert sequential.Report(_report(), timeout=10).stored
    expected = without_age(snapshot(sequential))
    assert expected.forward[0].samples == len(stored)
    assert expected.acceptance[0].accepted_total == 3 * len(stored)
    for replica in replicas:
        assert without_age(snapshot(connect(replica))) == expected
