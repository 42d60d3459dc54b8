"""`specrouter soak`: its percentiles, tallies, settings and verdict; the whole load against a fake router
and worker served on port 0 (fast); one short soak through a real local cluster (slow)."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent import futures

import grpc
import pytest
from typer.testing import CliRunner

from specrouter.cli import app
from specrouter.report.soak import SoakSettings, next_kind, rss_kib, rss_rows, run_soak
from specrouter.report.soak_results import (CANCELLED, CUT, DISCONNECTED, FINISHED, MIXED_KINDS, STREAM_CANCELLED,
                                            STREAM_DROPPED, STREAM_GREEDY, UNARY_GREEDY, UNARY_SAMPLED,
                                            GreedyOutputs, Outcome, Tally, format_soak, parse_duration, percentile,
                                            soak_failures)
from specrouter.report.workloads import Prompt
from specrouter.v1 import router_pb2 as pb
from specrouter.v1 import router_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.conftest import DEMO_POOL

# -- figures --------------------------------------------------------------------------------------


def test_percentile_interpolates_between_the_closest_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert [percentile(values, q) for q in (0, 50, 100)] == [1.0, 2.5, 4.0]
    assert percentile(values, 99) == pytest.approx(3.97)      # rank 2.97: 3 + 0.97 * (4 - 3)
    assert percentile(list(range(101)), 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_tally_counts_own_endings_apart_from_errors_and_shares_a_chunk_gap_among_its_tokens() -> None:
    tally = Tally()
    tally.observe(Outcome(UNARY_GREEDY, 0.0, 2.0, tokens=10))
    tally.observe(Outcome(STREAM_GREEDY, 1.0, 3.0, tokens=7, first_token_s=0.5, gaps=[(0.4, 4), (0.1, 2)]))
    tally.observe(Outcome(STREAM_CANCELLED, 1.0, 1.5, tokens=3, ending=CANCELLED, first_token_s=0.25, gaps=[(0.2, 2)]))
    tally.observe(Outcome(STREAM_DROPPED, 2.0, 2.5, tokens=2, ending=DISCONNECTED, first_token_s=0.3))
    tally.observe(Outcome(UNARY_SAMPLED, 3.0, 5.0, ending=CUT))
    tally.observe(Outcome(UNARY_SAMPLED, 3.0, 4.0, ending="", error="UNAVAILABLE", message="target down"))
    tally.observe(Outcome(UNARY_GREEDY, 3.0, 4.0, ending="", error="UNAVAILABLE", message="later"))
    s = tally.summary(seconds=11.0)
    assert s["requests"] == 7
    assert s["by_kind"] == {UNARY_GREEDY: 2, UNARY_SAMPLED: 2, STREAM_GREEDY: 1, STREAM_CANCELLED: 1,
                            STREAM_DROPPED: 1}
    assert s["endings"] == {FINISHED: 2, CANCELLED: 1, DISCONNECTED: 1, CUT: 1}
    assert (s["errors"], s["errors_by_status"], s["first_error"]) == (2, {"UNAVAILABLE": 2},
                                                                      {"UNAVAILABLE": "target down"})
    assert (s["tokens"], s["tokens_per_s"]) == (22, 2.0)
    # first tokens 250, 300, 500 ms: p99 at rank 1.98, 300 + 0.98 * 200
    assert s["first_token_ms"] == {"p50": pytest.approx(300.0), "p99": pytest.approx(496.0), "count": 3}
    # per token: four of 100 ms, two of 50 ms, two of 100 ms
    between = s["between_tokens_ms"]
    assert between["count"] == 8
    assert between["p50"] == pytest.approx(100.0) and between["p99"] == pytest.approx(100.0)
    assert percentile(tally.between_tokens_s, 0) == pytest.approx(0.05)
    assert tally.last_end == 5.0


def test_greedy_outputs_of_a_prompt_must_be_prefixes_of_each_other() -> None:
    greedy = GreedyOutputs()
    assert greedy.check("a", [1, 2, 3])
    assert greedy.check("a", [1, 2])              # a shorter request, or a stream ended early
    assert greedy.check("a", [1, 2, 3, 4, 5])     # a longer one: kept as the reference
    assert greedy.check("b", [9])
    assert not greedy.check("a", [1, 2, 3, 4, 6])
    assert greedy.checked == 5
    assert greedy.differ == ["prompt 'a': token 4 is 6 here, 5 before"]


# -- settings -------------------------------------------------------------------------------------


def test_durations_are_spoken_in_hours_minutes_and_seconds() -> None:
    assert [parse_duration(t) for t in ("90s", "10m", "1h", "1m30s", "45", "2.5", " 20S ")] == \
        [90, 600, 3600, 90, 45, 2.5, 20]
    for bad in ("", "10 minutes", "m", "5x", "1m-3s"):
        with pytest.raises(ValueError, match="like 90s"):
            parse_duration(bad)


def test_settings_name_every_value_out_of_range() -> None:
    with pytest.raises(ValueError) as caught:
        SoakSettings.parse(clients=0, duration="0s", warmup="1s", grace="5s", cancel_fraction=1.5, max_new_tokens=4,
                           max_rss_growth=10.0, seed=0)
    for flag in ("--clients", "--duration", "--cancel-fraction", "--max-new-tokens"):
        assert flag in str(caught.value)
    s = SoakSettings.parse(clients=16, duration="10m", warmup="30s", grace="1m", cancel_fraction=0.25,
                           max_new_tokens=48, max_rss_growth=10.0, seed=3)
    assert (s.duration_s, s.warmup_s, s.grace_s, s.cancelling_clients()) == (600, 30, 60, 4)
    assert [SoakSettings(clients=c, cancel_fraction=f).cancelling_clients()
            for c, f in ((4, 0.25), (1, 0.25), (3, 0.1), (5, 0.0), (5, 1.0))] == [1, 1, 1, 0, 5]


def test_a_cancelling_client_ends_every_other_request_by_cancel_and_by_disconnect_in_turn() -> None:
    rng = random.Random(0)
    kinds = [next_kind(rng, True, n) for n in range(8)]
    assert kinds[1::2] == [STREAM_CANCELLED, STREAM_DROPPED] * 2
    assert all(k in MIXED_KINDS for k in kinds[0::2])
    plain = [next_kind(rng, False, n) for n in range(200)]
    assert set(plain) == set(MIXED_KINDS)


# -- processes and the verdict --------------------------------------------------------------------


def test_rss_is_read_from_proc_and_growth_is_in_percent() -> None:
    assert rss_kib(os.getpid()) > 1000
    assert rss_kib(2 ** 22 + 12345) is None    # above Linux's largest pid
    rows = rss_rows({"router": 1024, "worker-a": 2048, "gone": 1024}, {"router": 1536, "worker-a": 2048, "gone": None})
    assert rows["router"] == {"start_mib": 1.0, "end_mib": 1.5, "growth_pct": 50.0}
    assert rows["worker-a"]["growth_pct"] == 0.0
    assert rows["gone"] == {"start_mib": 1.0, "end_mib": None, "growth_pct": None}


def _report(**changes) -> dict:
    tally = Tally()
    tally.observe(Outcome(UNARY_GREEDY, 0.0, 1.0, tokens=8))
    report = {"router": "127.0.0.1:1", "local_cluster": True, "cancelling_clients": 1, "seconds": 10.0,
              "warmup": {"requests": 2, "errors": 0, "errors_by_status": {}, "first_error": {}, "cut": 0},
              "settings": vars(SoakSettings()) | {"max_rss_growth": 10.0},
              **tally.summary(10.0), "greedy_checked": 1, "greedy_differ": [], "live_states": {"a": 0, "b": 0},
              "release_wait_s": 0.2, "rss": {"router": {"start_mib": 100.0, "end_mib": 105.0, "growth_pct": 5.0}},
              "exited": {}, "clients_stuck": 0, "clients_crashed": []}
    report.update(changes)
    return report


def test_the_verdict_names_each_reason_to_fail() -> None:
    assert soak_failures(_report()) == []
    assert "PASS" in format_soak(_report())
    failing = _report(errors=3, errors_by_status={"INTERNAL": 2, "UNAVAILABLE": 1},
                      first_error={"INTERNAL": "boom", "UNAVAILABLE": "gone"},
                      live_states={"a": 2, "b": 0, "c": None},
                      rss={"router": {"start_mib": 100.0, "end_mib": 120.0, "growth_pct": 20.0},
                           "profiler": {"start_mib": 100.0, "end_mib": 109.0, "growth_pct": 9.0}},
                      greedy_differ=["prompt 'x': token 1 is 2 here, 3 before"], exited={"worker-a": -9},
                      endings={FINISHED: 0, CANCELLED: 4, DISCONNECTED: 0, CUT: 1},
                      warmup={"requests": 5, "errors": 1, "errors_by_status": {"CANCELLED": 1},
                              "first_error": {"CANCELLED": "the call ended"}, "cut": 2})
    assert soak_failures(failing) == [
        "3 errors besides the clients' own cancellations (INTERNAL 2, UNAVAILABLE 1); first: INTERNAL: boom; "
        "UNAVAILABLE: gone",
        "1 errors in the warm-up besides the clients' own cancellations (CANCELLED 1); first: CANCELLED: the call ended",
        "no request finished",
        "3 requests had not finished 30s after the deadline and were cancelled",
        "live states at the end, after 0.2 s: a 2, c no answer",
        "1 greedy outputs differ from another of their prompt; first: prompt 'x': token 1 is 2 here, 3 before",
        "RSS of router grew 20.0% (limit 10%): 100 to 120 MiB",
        "worker-a exited during the soak with code -9",
    ]
    assert format_soak(failing).endswith("FAIL (8)")
    text = format_soak(_report(rss=None))
    assert "RSS                 n/a" in text and "time to first token p50 n/a" in text


# -- the load against a fake router ---------------------------------------------------------------


class FakeRouter(router_pb2_grpc.RouterServiceServicer):
    """Answers at once with tokens that depend on the prompt alone when greedy; streams one token a chunk;
    refuses every FAIL_EVERY-th call with RESOURCE_EXHAUSTED; holds a prompt that starts with "hang" until
    the call is cancelled."""

    FAIL_EVERY = 7

    def __init__(self, worker_address: str):
        self.worker_address = worker_address
        self.lock = threading.Lock()
        self.calls = self.refused = 0

    def _tokens(self, request, context) -> list[int]:
        with self.lock:
            self.calls += 1
            refuse = self.calls % self.FAIL_EVERY == 0
            self.refused += refuse
        if refuse:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the queue is full; retry later")
        if request.prompt.startswith("hang"):
            while context.is_active():
                time.sleep(0.01)
            return []
        base = sum(request.prompt.encode()) if request.temperature == 0 else request.seed
        return [(base + 31 * i) % 1000 for i in range(request.max_new_tokens)]

    def Generate(self, request, context):
        tokens = self._tokens(request, context)
        return pb.GenerateResponse(token_ids=tokens, finish_reason="length")

    def GenerateStream(self, request, context):
        for token in self._tokens(request, context):
            time.sleep(0.002)
            yield pb.GenerateChunk(token_ids=[token])
        yield pb.GenerateChunk(finish_reason="length", stats=pb.GenerationStats())

    def ListModels(self, request, context):
        return pb.ListModelsResponse(models=[pb.ModelInfo(name="fake", role="target", address=self.worker_address)])


class FakeWorker(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, live_states: int):
        self.live_states = live_states

    def Info(self, request, context):
        return worker_pb2.InfoResponse(model_name="fake", live_states=self.live_states)


@pytest.fixture
def fake_router():
    """Starts a fake router and worker on port 0: yields a function of the worker's live states that
    returns (router address, router servicer)."""
    servers = []

    def start(live_states: int = 0) -> tuple[str, FakeRouter]:
        worker_server = grpc.server(futures.ThreadPoolExecutor(4))
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(FakeWorker(live_states), worker_server)
        worker_port = worker_server.add_insecure_port("127.0.0.1:0")
        router = FakeRouter(f"127.0.0.1:{worker_port}")
        router_server = grpc.server(futures.ThreadPoolExecutor(32))
        router_pb2_grpc.add_RouterServiceServicer_to_server(router, router_server)
        router_port = router_server.add_insecure_port("127.0.0.1:0")
        for server in (worker_server, router_server):
            server.start()
            servers.append(server)
        return f"127.0.0.1:{router_port}", router

    yield start
    for server in servers:
        server.stop(0)


PROMPTS = [Prompt("code", f"def f{i}(x):") for i in range(5)]


def test_the_load_counts_every_call_and_the_refusals_as_errors_by_status(fake_router) -> None:
    address, router = fake_router()
    settings = SoakSettings(clients=4, duration_s=1.5, warmup_s=0.0, grace_s=30.0, cancel_fraction=0.5,
                            max_new_tokens=16)
    report = run_soak(settings, router=address, prompts=PROMPTS, release_wait_s=1.0)
    assert report["requests"] == router.calls > 20 and report["warmup"]["requests"] == 0
    assert report["errors_by_status"] == {"RESOURCE_EXHAUSTED": router.refused} and router.refused >= 3
    assert report["first_error"] == {"RESOURCE_EXHAUSTED": "the queue is full; retry later"}
    endings = report["endings"]
    assert endings[CANCELLED] >= 1 and endings[DISCONNECTED] >= 1 and endings[CUT] == 0
    assert endings[FINISHED] + endings[CANCELLED] + endings[DISCONNECTED] + report["errors"] == router.calls
    assert set(report["by_kind"]) == {*MIXED_KINDS, STREAM_CANCELLED, STREAM_DROPPED}
    assert report["cancelling_clients"] == 2
    assert report["tokens"] > 0 and report["first_token_ms"]["count"] > 0 and report["between_tokens_ms"]["count"] > 0
    assert report["greedy_checked"] > 0 and report["greedy_differ"] == []
    assert (report["live_states"], report["rss"], report["clients_stuck"], report["clients_crashed"]) == \
        ({"fake": 0}, None, 0, [])
    assert len(soak_failures(report)) == 1 and soak_failures(report)[0].startswith(f"{router.refused} errors")


def test_requests_past_the_grace_are_cut_not_errors_and_fail_the_soak_as_live_states_do(fake_router) -> None:
    address, router = fake_router(live_states=2)
    settings = SoakSettings(clients=2, duration_s=0.3, warmup_s=0.0, grace_s=0.3, cancel_fraction=0.0)
    report = run_soak(settings, router=address, prompts=[Prompt("code", "hang on")], release_wait_s=0.0)
    assert report["endings"] == {FINISHED: 0, CANCELLED: 0, DISCONNECTED: 0, CUT: 2}
    assert report["errors"] == 0 and report["clients_stuck"] == 0
    assert soak_failures(report) == ["no request finished",
                                     "2 requests had not finished 0.3s after the deadline and were cancelled",
                                     "live states at the end, after 0.0 s: fake 2"]


def test_the_command_prints_json_and_exits_1_on_errors(fake_router) -> None:
    address, router = fake_router()
    result = CliRunner().invoke(app, ["soak", "--router", address, "--clients", "2", "--duration", "1s",
                                      "--warmup", "0s", "--json"])
    assert result.exit_code == 1, result.output
    figures = json.loads(result.stdout)
    assert figures["requests"] == router.calls and figures["errors"] == router.refused >= 1
    assert "FAIL: " in result.stderr and "RESOURCE_EXHAUSTED" in result.stderr
    refused = CliRunner().invoke(app, ["soak", "--router", address, "--duration", "ten minutes"])
    assert refused.exit_code == 1 and "INVALID_ARGUMENT" in refused.stderr


# -- end to end (slow) ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_short_soak_through_a_local_cluster_holds() -> None:
    settings = SoakSettings(clients=4, duration_s=15.0, warmup_s=3.0, grace_s=120.0, cancel_fraction=0.5,
                            max_new_tokens=24, max_rss_growth=1000.0)
    report = run_soak(settings, pool_dir=DEMO_POOL)
    assert report["requests"] > 0 and report["endings"][FINISHED] > 0
    assert report["errors"] == 0, report["first_error"]
    assert report["endings"][CANCELLED] + report["endings"][DISCONNECTED] >= 1
    assert report["tokens"] > 0 and report["first_token_ms"]["count"] > 0
    assert report["greedy_checked"] > 0 and report["greedy_differ"] == []
    assert set(report["live_states"]) == {"stdlib-1m", "stdlib-5m", "stdlib-29m"}
    assert all(n == 0 for n in report["live_states"].values()), report["live_states"]
    assert set(report["rss"]) == {"profiler", "router", "worker-stdlib-1m", "worker-stdlib-5m", "worker-stdlib-29m"}
    assert all(row["start_mib"] > 10 and row["end_mib"] > 10 for row in report["rss"].values())
    assert soak_failures(report) == []
