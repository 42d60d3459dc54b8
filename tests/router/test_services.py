"""The services as separate processes: `specrouter up` on the demo pool, a real Redis behind the
profiler, an OTLP receiver for traces, and clients over gRPC."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest

from specrouter import AsyncClient, Client, DeadlineExceededError, InvalidRequestError
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.inprocess import InProcessPool
from specrouter.v1 import profiler_pb2, profiler_pb2_grpc, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from specrouter.contract.calls import SamplingParams
from specrouter.router.chain import TARGET_ONLY_BLOCK
from specrouter.router.lookup import LOOKUP
from specrouter.report.scheduler_report import format_report
from specrouter.router.scheduling.settings import SchedulerSettings
from tests.conftest import DEMO_POOL
from tests.router.load import other_requests
from tests.traces import trace_endpoint

NEW_TOKENS = 24
START_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def traces():
    with trace_endpoint() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def redis(redis_factory):
    return redis_factory()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, redis, traces):
    """`specrouter up --port 0` as a user runs it; yields (process, router address)."""
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{traces[1]}",
           "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "200",
           # the scheduler explores every third cycle, so "auto" requests switch chains all the time
           "SPECROUTER_ROUTER_SCHEDULER__EXPLORE_AFTER_S": "0", "SPECROUTER_ROUTER_SCHEDULER__EXPLORE_EVERY_CYCLES": "3"}
    logs = tmp_path_factory.mktemp("logs")
    proc = subprocess.Popen([sys.executable, "-m", "specrouter.cli", "up", "--pool", str(DEMO_POOL), "--port", "0",
                             "--redis-url", redis.url, "--log-dir", str(logs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + START_TIMEOUT_S
    services: dict[str, str] = {}   # "profiler", "worker-NAME", "router" -> address
    address = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if " up at " in line:
            name, _, at = line.strip().partition(" up at ")
            services[name] = at
        if line.startswith("router listening on "):
            address = line.split()[-1]
            break
        if not line and proc.poll() is not None:
            break
    assert address, f"specrouter up did not start: {proc.stderr.read()[-3000:]}"
    yield proc, address, services
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster[1], timeout_s=120) as c:
        yield c


@pytest.fixture(scope="module")
def local() -> InProcessPool:
    return InProcessPool.open(DEMO_POOL)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return heldout_code_prompts(6)


def live_states(client: Client) -> dict[str, int]:
    out = {}
    for m in client.models():
        with grpc.insecure_channel(m.address) as ch:
            out[m.name] = worker_pb2_grpc.WorkerServiceStub(ch).Info(worker_pb2.InfoRequest()).live_states
    return out


def wait_no_states(client: Client, timeout: float = 20.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        states = live_states(client)
        if not any(states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def test_every_static_chain_through_the_router_is_exact(client, local, prompts) -> None:
    """Target-only and every chain, requests in flight together, equal in-process target-only greedy."""
    ids = [local.encode(p) for p in prompts]
    expected = [r.generated for r in local.generate_ids(ids, (local.target,), 1, [SamplingParams()] * len(ids),
                                                        NEW_TOKENS)]
    small, mid = local.by_size()[:2]
    chains = ["target", f"{small},{local.target}", f"{mid},{local.target}", f"{small},{mid},{local.target}",
              f"lookup,{local.target}", f"lookup,{small},{local.target}"]
    with futures.ThreadPoolExecutor(len(prompts)) as pool:
        for chain in chains:
            got = list(pool.map(lambda p: client.generate(p, max_new_tokens=NEW_TOKENS, chain=chain, window=3).token_ids,
                                prompts))
            assert got == expected, chain
    assert not any(wait_no_states(client).values())


def test_a_named_chain_without_a_window_gets_the_schedulers_window(client, local, prompts) -> None:
    ids = [local.encode(p) for p in prompts[:2]]
    expected = [r.generated for r in local.generate_ids(ids, (local.target,), 1, [SamplingParams()] * len(ids),
                                                        NEW_TOKENS)]
    small, mid = local.by_size()[:2]
    chain = f"{mid},{small},{local.target}"     # never the scheduler's own choice on the demo pool
    with futures.ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda p: client.generate(p, max_new_tokens=NEW_TOKENS, chain=chain, window=0), prompts[:2]))
    assert [g.token_ids for g in got] == expected
    assert all(set(g.stats.chain_counts) == {chain} for g in got)


def test_each_response_says_where_its_cycles_spent_their_time(client, local, prompts) -> None:
    """The breakdown nests: forward passes inside the worker's handler, inside the router's round trip,
    inside the cycle; a target-only request with the window left open decodes blocks of tokens a call."""
    small = local.by_size()[0]
    for chain, window, models in [("target", 0, {local.target}), (f"{small},{local.target}", 3, {small, local.target})]:
        result = client.generate(prompts[0], max_new_tokens=NEW_TOKENS, chain=chain, window=window)
        b, stats = result.stats.breakdown, result.stats
        assert set(b.levels) == models
        for level in b.levels.values():
            assert level.calls == stats.cycles
            assert 0 < level.forward_ns <= level.handler_ns <= level.call_ns
        # a named chain's rows join on each of its models: no model prefills them late
        assert b.late_prefill_ns == 0
        assert sum(level.call_ns for level in b.levels.values()) + b.choose_ns <= b.cycle_ns
        assert 0 < b.prefill_ns and b.cycle_ns + b.prefill_ns <= stats.total_ns
    target_only = client.generate(prompts[0], max_new_tokens=NEW_TOKENS, chain="target")
    assert target_only.stats.cycles == -(-target_only.stats.generated_tokens // TARGET_ONLY_BLOCK)


def test_continuous_batching_keeps_each_requests_output(client, prompts) -> None:
    """Requests of different lengths and parameters, each joining the batch while the first one runs, give
    what each gives alone."""
    specs = [dict(max_new_tokens=300), dict(max_new_tokens=8, temperature=0.9, seed=3),
             dict(max_new_tokens=30, temperature=1.1, top_k=20, seed=4), dict(max_new_tokens=16, repetition_penalty=1.3),
             dict(max_new_tokens=24, temperature=0.7, top_p=0.9, seed=5), dict(max_new_tokens=12)]
    # a named chain: sampled tokens are a function of (seed, cycle, level), so a seed reproduces them for a
    # given chain and window, and "auto" (whose choices vary with load) reproduces only greedy outputs
    chain = dict(chain="stdlib-1m,stdlib-29m", window=4)
    alone = [client.generate(p, **s, **chain).token_ids for p, s in zip(prompts, specs)]

    together: list[list[int]] = [[] for _ in specs]
    first_done = threading.Event()

    def run(i: int, started: threading.Event) -> None:
        for chunk in client.generate_stream(prompts[i], **specs[i], **chain):
            together[i] += chunk.token_ids
            started.set()
        if i == 0:
            first_done.set()

    # each request is sent once the one before it streams, and must stream before the first one ends: it
    # joined the batch (one chain and window: one batch) while that batch ran
    joined, threads = [], []
    for i in range(len(specs)):
        started = threading.Event()
        threads.append(threading.Thread(target=run, args=(i, started)))
        threads[-1].start()
        assert started.wait(60), f"request {i} sent nothing"
        joined.append(not first_done.is_set())
    for t in threads:
        t.join(120)
    assert together == alone
    assert all(joined), joined
    assert not any(wait_no_states(client).values())


def test_cancelled_stream_releases_its_worker_state(client, prompts) -> None:
    stream = client.stub.GenerateStream(router_pb2.GenerateRequest(prompt=prompts[0], max_new_tokens=500, window=2))
    next(stream)
    stream.cancel()
    with pytest.raises(grpc.RpcError):
        list(stream)
    assert not any(wait_no_states(client).values())


@pytest.fixture(scope="module")
def long_prompt(client, prompts) -> str:
    """A prompt whose greedy continuation runs 200 tokens without EOS."""
    return next(p for p in prompts if client.generate(p, max_new_tokens=200, chain="target").finish_reason == "length")


def test_deadline_releases_the_request(cluster, client, long_prompt) -> None:
    with Client(cluster[1], timeout_s=0.3) as hurried:  # seconds of work against a 0.3 s deadline
        with pytest.raises(DeadlineExceededError):
            hurried.generate(long_prompt, max_new_tokens=200, chain="target")
    assert not any(wait_no_states(client).values())


def test_stop_strings_end_the_output(client, local, long_prompt) -> None:
    free = client.generate(long_prompt, max_new_tokens=32, chain="target")
    cut = next(i for i in range(6, 30) if local.tokenizer.decode(free.token_ids[i : i + 2]).strip())
    stop = local.tokenizer.decode(free.token_ids[cut : cut + 2])
    got = client.generate(long_prompt, max_new_tokens=32, chain="stdlib-1m,stdlib-29m", window=4, stop=[stop])
    assert got.finish_reason == "stop" and stop in got.text
    assert got.token_ids == free.token_ids[: len(got.token_ids)]
    assert stop not in local.tokenizer.decode(got.token_ids[:-1])  # nothing kept past the stop


def test_a_stop_string_at_the_last_allowed_token_stops_every_chain(client, local, prompts) -> None:
    """A stop string that completes in the cycle that reaches max_new_tokens ends the request 'stop', on the
    same tokens, whatever the chain and the window."""
    checked = 0
    for prompt in prompts:
        free = client.generate(prompt, max_new_tokens=6, chain="target", window=1)
        stop = local.tokenizer.decode(free.token_ids[-2:]).strip()
        if not stop or stop in local.tokenizer.decode(free.token_ids[:-1]):   # it must complete at the last token
            continue
        for chain, window in [("target", 0), ("target", 1), ("stdlib-1m,stdlib-29m", 4),
                              ("stdlib-1m,stdlib-5m,stdlib-29m", 2), ("auto", 0)]:
            got = client.generate(prompt, max_new_tokens=6, chain=chain, window=window, stop=[stop])
            assert (got.finish_reason, got.token_ids) == ("stop", free.token_ids), (chain, window, stop)
        checked += 1
    assert checked >= 3, "too few prompts end in a stop string of their own; pick others"


def test_a_seed_pins_the_text_whatever_the_chain_and_the_load(client, prompts) -> None:
    """A seeded sampled request gives the same token ids under target-only decoding, every static chain at
    several windows (the lookup's too) and auto, while other requests come and go around it (seeds past 2**32 included)."""
    configurations = [("target", 0), ("target", 1), ("stdlib-1m,stdlib-29m", 2), ("stdlib-1m,stdlib-29m", 5),
                      ("stdlib-5m,stdlib-29m", 3), ("stdlib-1m,stdlib-5m,stdlib-29m", 4), ("lookup,stdlib-29m", 6),
                      ("lookup,stdlib-1m,stdlib-29m", 3), ("auto", 0)]
    cases = [(prompts[0], 7), (prompts[1], 2**40 + 11), (prompts[2], 2**62 + 5)]
    with other_requests(client, prompts[3:6], loaders=3, min_tokens=8, token_spread=13):
        for prompt, seed in cases:
            texts = {(chain, window): client.generate(prompt, max_new_tokens=20, temperature=0.8, top_p=0.95,
                                                      seed=seed, chain=chain, window=window).token_ids
                     for chain, window in configurations}
            assert len({tuple(t) for t in texts.values()}) == 1, (seed, texts)


def test_async_client_and_streaming_agree_with_the_blocking_client(cluster, client, prompts) -> None:
    params = dict(max_new_tokens=20, temperature=0.8, seed=9, chain="stdlib-1m,stdlib-29m", window=3)
    expected = client.generate(prompts[3], **params)

    async def run():
        async with AsyncClient(cluster[1]) as aclient:
            result = await aclient.generate(prompts[3], **params)
            chunks = [c async for c in aclient.generate_stream(prompts[3], **params)]
        return result, chunks

    result, chunks = asyncio.run(run())
    assert result.token_ids == expected.token_ids and result.text == expected.text
    assert [t for c in chunks for t in c.token_ids] == expected.token_ids
    assert "".join(c.text for c in chunks) == expected.text
    assert chunks[-1].finish_reason == "length" and chunks[-1].stats.generated_tokens == 20


BAD = [
    (dict(prompt=""), "empty"),
    (dict(prompt="x = 1\n" * 800), "shorten the prompt"),
    (dict(max_new_tokens=0), "at least 1"),
    (dict(max_new_tokens=10**6), "at most"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(chain="nosuchmodel,stdlib-29m"), "unknown model"),
    (dict(chain="stdlib-1m"), "must end at the target"),
    (dict(chain="stdlib-1m,lookup,stdlib-29m"), "can only start a chain"),
    (dict(window=99), "window"),
    # values the wire cannot carry are refused by the client, by name, before any call
    (dict(max_new_tokens=-1), "max_new_tokens=-1 cannot be sent (it cannot be negative)"),
    (dict(window=-2), "window=-2 cannot be sent (it cannot be negative)"),
    (dict(seed=2**70), "seed="),
    (dict(temperature="hot"), "temperature='hot'"),
]


@pytest.mark.parametrize("change,words", BAD, ids=[w for _, w in BAD])
def test_bad_input_is_refused_with_a_useful_message(client, change, words) -> None:
    params = dict(prompt="def f(x):", max_new_tokens=4) | change
    with pytest.raises(InvalidRequestError) as err:
        client.generate(params.pop("prompt"), **params)
    assert words in err.value.message
    assert client.generate("def g(y):", max_new_tokens=2).token_ids  # still serving


def test_the_lookup_level_is_listed_and_runs_with_the_window_left_open(client, local, prompts) -> None:
    """`models(levels=True)` adds the lookup (no parameters, no address: it runs in the router); a lookup chain
    with no window named runs at the router's default window, with the target's greedy tokens."""
    assert [m.name for m in client.models()] == local.by_size()
    listed = client.models(levels=True)
    assert [m.name for m in listed] == [*local.by_size(), "lookup"]
    assert (listed[-1].parameters, listed[-1].address) == (0, "")
    ids = local.encode(prompts[1])
    expected = local.generate_ids([ids], (local.target,), 1, [SamplingParams()], NEW_TOKENS)[0].generated
    result = client.generate(prompts[1], max_new_tokens=NEW_TOKENS, chain=f"lookup,{local.target}", window=0)
    assert result.token_ids == expected
    assert result.stats.chain_counts == {f"lookup,{local.target}": result.stats.cycles}


def test_one_stop_string_is_one_stop_sequence() -> None:
    from specrouter.client import _request
    assert list(_request("x", stop="\n\n").stop) == ["\n\n"]
    assert list(_request("x", stop=["a", "bc"]).stop) == ["a", "bc"]


def test_malformed_utf8_is_refused(cluster, client) -> None:
    raw = b"\x0a\x04\xff\xfe\x80\x81"  # field 1 (prompt), four bytes that are not UTF-8
    call = client.channel.unary_unary("/specrouter.v1.RouterService/Generate",
                                      request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as err:
        call(raw, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in err.value.details()
    assert client.generate("x", max_new_tokens=1).token_ids


def test_cli_generate_json_models_and_errors(cluster) -> None:
    address = cluster[1]
    run = lambda *a: subprocess.run([sys.executable, "-m", "specrouter.cli", *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=120)
    out = run("generate", "--router", address, "--max-new-tokens", "8", "--json", "import os")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"text", "token_ids", "finish_reason", "cycles", "chain_counts", "accepted_per_level"} <= set(data)
    assert len(data["token_ids"]) == 8 and data["finish_reason"] == "length"
    models = json.loads(run("models", "--router", address, "--json").stdout)
    assert [m["role"] for m in models].count("target") == 1
    assert all(m["parameters"] > 0 for m in models if m["role"] != "lookup")
    assert [(m["name"], m["parameters"]) for m in models if m["role"] == "lookup"] == [("lookup", 0)]
    bad = run("generate", "--router", address, "--chain", "nope", "x")
    assert bad.returncode != 0 and "INVALID_ARGUMENT" in bad.stderr and "Traceback" not in bad.stderr


def profiler_snapshot(address: str, until=lambda snap: True, timeout: float = 10.0) -> profiler_pb2.SnapshotResponse:
    with grpc.insecure_channel(address) as ch:
        stub = profiler_pb2_grpc.ProfilerServiceStub(ch)
        deadline = time.monotonic() + timeout
        while True:
            snap = stub.Snapshot(profiler_pb2.SnapshotRequest())
            if until(snap) or time.monotonic() > deadline:
                return snap
            time.sleep(0.2)


def test_profiler_holds_measurements_from_the_router(cluster, client) -> None:
    client.generate("class Stack:", max_new_tokens=16, chain="stdlib-1m,stdlib-5m,stdlib-29m")
    models = {m.name for m in client.models()}
    snap = profiler_snapshot(cluster[2]["profiler"], until=lambda s: {f.model for f in s.forward} == models)
    assert {f.model for f in snap.forward} == models and not snap.stale
    assert any(a.proposed_total > 0 for a in snap.acceptance)


def test_adaptive_output_is_exact_while_the_scheduler_switches_chains(client, local, prompts) -> None:
    """Greedy "auto" equals target-only token for token, with chains changing between cycles (exploring
    every third cycle: models that sat out catch up first)."""
    ids = [local.encode(p) for p in prompts]
    expected = [r.generated for r in local.generate_ids(ids, (local.target,), 1, [SamplingParams()] * len(ids),
                                                        NEW_TOKENS * 2)]
    with futures.ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda p: client.generate(p, max_new_tokens=NEW_TOKENS * 2), prompts))
    assert [g.token_ids for g in got] == expected
    used = set().union(*(g.stats.chain_counts for g in got))
    assert len(used) >= 3, used     # the scheduler's choice and at least two explored chains
    assert not any(wait_no_states(client).values())


def test_schedule_ranks_every_candidate_and_shows_its_estimates(cluster, client) -> None:
    names = [m.name for m in client.models()]   # smallest first, the target last
    small, mid, target = names
    with grpc.insecure_channel(cluster[1]) as ch:
        stub = router_pb2_grpc.RouterServiceStub(ch)
        reply = stub.Schedule(router_pb2.ScheduleRequest(greedy_rows=4))
        with pytest.raises(grpc.RpcError) as error:
            stub.Schedule(router_pb2.ScheduleRequest(greedy_rows=5000))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "at most" in error.value.details()
    got = {(tuple(c.chain), c.window) for c in reply.candidates}
    chains = [(small, target), (mid, target), (small, mid, target)]   # each model larger than the one before
    # the model-free level in front, within 4 levels, at longer windows too as far as each level's
    # hand-up stays within 16 tokens
    lookups = [(LOOKUP, *c) for c in [(target,), *chains]]
    longer = {(c, w) for c in lookups for w in (12, 15) if w + len(c) - 2 <= 16}
    assert got == {((target,), 0)} | {(c, w) for c in chains + lookups for w in range(1, 9)} | longer
    t_eff = [c.predicted_t_eff_ms for c in reply.candidates]
    assert t_eff == sorted(t_eff) and all(t > 0 for t in t_eff)
    assert all(abs(c.predicted_t_eff_ms - c.predicted_cycle_ms / c.predicted_emitted) < 1e-6 for c in reply.candidates)
    pairs = {(p.drafter, p.verifier): p for p in reply.pairs}
    models = {(small, target), (mid, target), (small, mid)}
    assert set(pairs) == models | {(LOOKUP, small), (LOOKUP, mid), (LOOKUP, target)}
    shipped = json.loads((DEMO_POOL / "similarity.json").read_text())["pairs"]
    offline = {(p["drafter"], p["verifier"]): p["similarity"] for p in shipped if p["mode"] == "greedy"}
    lookup_pairs = {pair: pairs.pop(pair) for pair in [(LOOKUP, small), (LOOKUP, mid), (LOOKUP, target)]}
    for p in lookup_pairs.values():   # no distribution: no similarity, and a prior of its own
        assert not p.HasField("similarity") and not p.HasField("live_similarity")
        assert p.prior == pytest.approx(SchedulerSettings().lookup_prior)
    # ... and the lookup judged by the target's tokens in every greedy cycle, whatever chain ran
    assert lookup_pairs[(LOOKUP, target)].HasField("realized")
    for pair, p in pairs.items():
        assert p.mode == "greedy" and p.similarity == pytest.approx(offline[pair]) and len(p.rates) == 8
        assert p.HasField("realized") and p.HasField("live_similarity")   # every pair measured by now
    assert reply.decisions > 0 and reply.explorations > 0 and reply.decision_us > 0 and reply.cycle_ms > 0
    # the scheduler's cycles (a chain named with its window left open but outside the candidates, as
    # 5m -> 1m -> 29m, runs unplanned at a middle window)
    adaptive = [ledger for ledger in reply.ledgers if ledger.adaptive and (tuple(ledger.chain), ledger.window) in got]
    assert adaptive and all(ledger.predicted_emitted > 0 for ledger in adaptive)


@pytest.mark.slow   # a short scheduler report, end to end
def test_scheduler_report_runs_against_a_router(cluster, tmp_path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"kind": k, "prompt": p}) for k, p in
                                 [("code", "def f(x):\n"), ("code", "import os\n"), ("prose", "The weather was")]))
    out = subprocess.run([sys.executable, "-m", "specrouter.cli", "scheduler-report", "--router", cluster[1],
                          "--prompts", str(prompts), "--batch-sizes", "1,2", "--windows", "2", "--repeats", "1",
                          "--runoff-passes", "1", "--runoff-waves", "4", "--runoff-top", "1", "--max-new-tokens", "6", "--requests", "2",
                          "--switching", "code>prose", "--switching-runoff-passes", "3",
                          "--out", str(tmp_path / "report"), "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert [(r["kind"], r["batch_size"]) for r in report["runs"]] == \
        [("code", 1), ("code", 2), ("prose", 1), ("prose", 2), ("switching:code>prose", 1)]
    for run in report["runs"]:
        assert run["target_only_tokens_per_s"] > 0 and run["adaptive_tokens_per_s"] > 0
        # target-only and every chain at window 2: 4 of the models (growing towards the target), and the
        # same 4 with the lookup in front
        assert len(run["static"]) == 8
        for x in run["static"]:
            assert {"chain", "window", "tokens_per_s", "predicted_t_eff_ms", "measured_t_eff_ms"} <= set(x)
            assert x["predicted_t_eff_ms"] > 0 and x["measured_t_eff_ms"] > 0
            # measured over the cycles at the run's batch size (all of them at batch 1)
            assert 0 <= x["cycles_at_batch_size"] <= x["cycles"]
            if run["batch_size"] == 1:
                assert x["cycles_at_batch_size"] == x["cycles"]
                assert x["measured_t_eff_ms"] == pytest.approx(x["measured_t_eff_all_cycles_ms"])
        runoff = run["runoff"]   # adaptive, target-only and the screening's fastest static, measured again
        screened = max(run["static"][1:], key=lambda x: x["tokens_per_s"])
        assert [(x["chain"], x["window"]) for x in runoff["static"]] == \
            [(run["static"][0]["chain"], 0), (screened["chain"], screened["window"])]
        # two waves of 2 requests: passes until 4 waves, one at least; the switching run's own 3 passes
        passes = 3 if run["kind"].startswith("switching") else 2
        assert runoff["passes"] == passes and len(runoff["adaptive_tokens_per_s_runs"]) == passes
        assert runoff["adaptive_measured_t_eff_ms"] > 0 and all(x["measured_t_eff_ms"] > 0 for x in runoff["static"])
        if run["batch_size"] == 1:   # the client's time holds the cycles' and more (prefill, round trips)
            assert runoff["adaptive_outside_cycles_ms_per_token"] > 0
            assert all(x["outside_cycles_ms_per_token"] > 0 for x in runoff["static"])
        assert runoff["adaptive_over_best_static"] == pytest.approx(
            runoff["adaptive_tokens_per_s"] / max(x["tokens_per_s"] for x in runoff["static"]))
        assert runoff["adaptive_over_best_static_se"] > 0   # from 4 waves at least, which never run alike
        chosen = run["adaptive"]["per_config"]   # every cycle of adaptive, by what it chose
        assert sum(c["cycles"] for c in chosen.values()) == run["adaptive"]["cycles"] > 0
        assert all(c["predicted_emitted"] >= 1 and c["measured_cycle_ms"] > 0 for c in chosen.values())
        chosen = runoff["adaptive_per_config"]   # the same for adaptive's run-off cycles
        assert chosen and all(c["cycles"] > 0 and c["measured_cycle_ms"] > 0 for c in chosen.values())
        by_rows = runoff["adaptive_cycles_by_rows"]   # the same cycles again, split by the rows they ran
        assert sum(c["cycles"] for c in by_rows) == sum(c["cycles"] for c in chosen.values())
        assert {c["config"] for c in by_rows} == set(chosen)
        assert all(1 <= c["rows"] <= run["batch_size"] for c in by_rows)
        waves = runoff["adaptive_waves"]   # and again wave by wave, beside the statics' waves
        assert len(waves) == passes * run["requests"] // run["batch_size"]
        assert [w["wave"] for w in waves] == list(range(run["requests"] // run["batch_size"])) * passes
        assert sum(c["cycles"] for w in waves for c in w["choices"].values()) == sum(c["cycles"] for c in chosen.values())
        # beside target-only and the screening's fastest static
        assert all(w["tokens_per_s"] > 0 and len(w["statics_tokens_per_s"]) == 2 for w in waves)
        for x in runoff["static"]:
            label = ",".join(x["chain"]) + (f" W{x['window']}" if len(x["chain"]) > 1 else "")
            assert x["cycles_by_rows"] and {c["config"] for c in x["cycles_by_rows"]} == {label}
        assert set(runoff["planning_ms_per_s"]) == {"adaptive", "stdlib-29m", f"{','.join(screened['chain'])} W2"}
        # the planner's own time: none when no plan needed remaking during the run (its snapshot unchanged)
        assert all(math.isfinite(v) and v >= 0 for v in runoff["planning_ms_per_s"].values())
    assert report["acceptance"] and all({"pair", "predicted", "realized"} <= set(a) for a in report["acceptance"])
    assert set(report["checks"]) >= {"adaptive_within_5pct_of_best_static", "acceptance_within_0.05"}
    assert "%]" in out.stderr or "min left" in out.stderr   # progress, one line per run
    assert report["machine"].startswith("CPU ") and "torch " in report["machine"]   # the machine it ran on
    assert format_report(report).splitlines()[0] == report["machine"]
    png = (tmp_path / "report" / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert json.loads((tmp_path / "report" / "report.json").read_text()) == report


def test_one_trace_per_request_spans_every_service(client, traces) -> None:
    receiver, _ = traces
    client.generate("def parse(text):", max_new_tokens=8, chain="stdlib-1m,stdlib-5m,stdlib-29m", window=3)
    services = {"specrouter-router", "specrouter-profiler"} | {f"specrouter-worker-{m.name}" for m in client.models()}
    # the prefill and release calls too, which the router makes to every worker at once from other threads
    calls = {"cycle", "prefill", "release"} | {f"/specrouter.v1.WorkerService/{m}" for m in
                                               ("Prefill", "Draft", "Verify", "Release")}
    deadline = time.monotonic() + 30   # bound on polling, not a timing assertion
    while True:
        with receiver.lock:
            spans = list(receiver.spans)
        generate_traces = {s.trace_id for s in spans if s.name == "/specrouter.v1.RouterService/Generate"}
        by_trace = {t: {s.service for s in spans if s.trace_id == t} for t in generate_traces}
        names = {s.name for s in spans if s.trace_id in generate_traces}
        if (any(found >= services for found in by_trace.values()) and calls <= names) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert any(found >= services for found in by_trace.values()), by_trace
    assert calls <= names, calls - names


def test_redis_outage_does_not_stop_the_router(cluster, client, redis) -> None:
    profiler = cluster[2]["profiler"]
    redis.kill()
    try:
        assert client.generate("for i in range(10):", max_new_tokens=12).token_ids
        assert profiler_snapshot(profiler, until=lambda s: s.stale).stale
    finally:
        redis.start()
    for _ in range(20):  # the profiler skips the store for a moment after a failure; keep reporting
        client.generate("while True:", max_new_tokens=12)
        snap = profiler_snapshot(profiler, until=lambda s: not s.stale and bool(s.forward), timeout=1.0)
        if snap.forward:
            break
    assert not snap.stale and snap.forward


def test_sigint_stops_every_service(cluster) -> None:
    proc, _, services = cluster
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) == len(services)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()
