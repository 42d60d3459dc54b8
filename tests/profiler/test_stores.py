"""The metrics themselves: EMA arithmetic, buckets, and the two stores agreeing exactly."""

from __future__ import annotations

import random

import pytest

from specrouter.contract.measures import bucket
from specrouter.v1 import profiler_pb2 as pb

from .reports import GREEDY, SAMPLING, acceptance, forward, similarity, snapshot, without_age

ALPHA = 0.1              # per report: forward latency and similarity
ACCEPTANCE_ALPHA = 0.01  # per check: acceptance (the stores' default)


def _weighted_mean(values: list[float], weights: list[float] | None = None, alpha: float = ALPHA) -> float:
    """The EMA with a zero start, divided by the EMA of 1: sum_i w_i v_i / sum_i w_i, w_i = (1 - alpha)^(n - i)."""
    decay = [(1 - alpha) ** (len(values) - 1 - i) for i in range(len(values))]
    weights = weights or [1.0] * len(values)
    return sum(d * w * v for d, w, v in zip(decay, weights, values)) / sum(d * w for d, w in zip(decay, weights))


def test_bucket_is_exact_up_to_16_then_the_next_power_of_two() -> None:
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 9, 16, 17, 32, 33, 65536)] == [1, 2, 3, 4, 5, 9, 16, 32, 32, 64, 65536]


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_snapshot_holds_the_ema_of_each_key(kind, make_store, serve, connect) -> None:
    stub = connect(serve(make_store(kind)))
    times = [100, 200, 400]
    counts = [(3, 4), (1, 1), (0, 2)]   # (accepted, proposed)
    for ns, (a, p), sim, n in zip(times, counts, [0.5, 0.7, 0.9], [4, 1, 2]):
        stub.Report(pb.ReportRequest(
            # batch 17 and 32 share bucket 32; batch 33 goes to bucket 64
            forward=[forward(ns, batch_size=17), forward(ns, batch_size=32), forward(7 * ns, batch_size=33)],
            acceptance=[acceptance(a, p, position=2, mode=SAMPLING)],
            similarity=[similarity(sim, mode=SAMPLING, positions=n)]), timeout=10)
    got = snapshot(stub)
    assert not got.stale and got.ema_alpha == ALPHA and got.acceptance_alpha == ACCEPTANCE_ALPHA

    assert [(f.batch_size_bucket, f.tokens_per_row_bucket, f.samples) for f in got.forward] == [(32, 1, 6), (64, 1, 3)]
    assert got.forward[0].ema_forward_ns == pytest.approx(_weighted_mean([t for t in times for _ in (0, 1)]), rel=1e-12)
    assert got.forward[1].ema_forward_ns == pytest.approx(_weighted_mean([7 * t for t in times]), rel=1e-12)

    [acc] = got.acceptance
    assert (acc.drafter, acc.verifier, acc.mode, acc.position) == ("s", "t", SAMPLING, 2)
    assert (acc.accepted_total, acc.proposed_total, acc.samples) == (4, 7, 3)
    # check by check: a report of p checks is p steps, each bringing the report's rate
    per_check = [a / p for a, p in counts for _ in range(p)]
    assert acc.ema_acceptance_rate == pytest.approx(_weighted_mean(per_check, alpha=ACCEPTANCE_ALPHA), rel=1e-12)

    [sim] = got.similarity
    assert (sim.samples, sim.mode, sim.positions_total) == (3, SAMPLING, 7)
    assert sim.ema_similarity == pytest.approx(_weighted_mean([0.5, 0.7, 0.9], [4, 1, 2]), rel=1e-12)


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_acceptance_remembers_checks_not_reports(kind, make_store, serve, connect) -> None:
    """A pair drafting perfectly, then 16 rejections: whether they come as 16 reports of one check (batch
    1) or one report of 16 (batch 16), the rate falls alike; a memory counted in reports would fall
    16 times as far at batch 1 as at batch 16 (here 0.19 against 0.90)."""
    stub = connect(serve(make_store(kind)))
    for rows in (1, 16):   # one drafter per batch size
        for _ in range(800 // rows):
            stub.Report(pb.ReportRequest(acceptance=[acceptance(rows, rows, drafter=f"s{rows}")]), timeout=10)
        for _ in range(16 // rows):
            stub.Report(pb.ReportRequest(acceptance=[acceptance(0, rows, drafter=f"s{rows}")]), timeout=10)
    a, b = sorted(snapshot(stub).acceptance, key=lambda r: len(r.drafter))
    assert (a.proposed_total, b.proposed_total) == (816, 816) and (a.samples, b.samples) == (816, 51)
    fallen = 1 - (1 - ACCEPTANCE_ALPHA) ** 16   # the weight of the last 16 checks
    expected = (1 - fallen) * (1 - (1 - ACCEPTANCE_ALPHA) ** 800) / (1 - (1 - ACCEPTANCE_ALPHA) ** 816)
    assert a.ema_acceptance_rate == pytest.approx(expected, rel=1e-9)
    assert b.ema_acceptance_rate == pytest.approx(expected, rel=1e-9)


def _random_reports(seed: int, count: int) -> list[pb.ReportRequest]:
    rng = random.Random(seed)
    models = ["a-1m", "b-5m", "c-29m"]
    reports = []
    for _ in range(count):
        d, v = rng.sample(models, 2)
        proposed = rng.randint(1, 16)
        reports.append(pb.ReportRequest(
            forward=[forward(rng.randint(1, 10**9), model=rng.choice(models), batch_size=rng.randint(1, 40),
                             tokens_per_row=rng.randint(1, 9)) for _ in range(rng.randint(0, 3))],
            acceptance=[acceptance(rng.randint(0, proposed), proposed, position=rng.randint(0, 4),
                                   mode=rng.choice([GREEDY, SAMPLING]), drafter=d, verifier=v)],
            similarity=[similarity(rng.random(), drafter=d, verifier=v)] if rng.random() < 0.5 else []))
    return reports


def test_memory_and_redis_stores_give_identical_snapshots(make_store, serve, connect) -> None:
    """The same reports, in the same order, give the same snapshot bit for bit: both stores compute
    the same double arithmetic, and the Redis store writes doubles with 17 significant digits."""
    memory, shared = (connect(serve(make_store(kind))) for kind in ("memory", "redis"))
    for report in _random_reports(seed=7, count=150):
        assert memory.Report(report, timeout=10).stored and shared.Report(report, timeout=10).stored
    from_memory, from_redis = without_age(snapshot(memory)), without_age(snapshot(shared))
    assert len(from_memory.forward) > 20 and len(from_memory.acceptance) > 20
    assert from_memory == from_redis
