"""The router holding the pool's models itself (`--models-in-process`, `specrouter up --models-in-router`):
every chain's greedy output is the target's, every engine call runs on the compute thread, and settings
that cannot work are refused by name."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from pydantic import ValidationError

from specrouter.client import Client
from specrouter.contract.calls import RowStep, SamplingParams, StepResult, VerifyRow
from specrouter.inprocess import InProcessPool
from specrouter.launcher import LocalCluster
from specrouter.models_in_process import ComputeLoop, EngineOnComputeThread, load_pool_engines
from specrouter.pool.load import load_tokenizer
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.router.lookup import LOOKUP
from specrouter.router.settings import RouterSettings
from tests.conftest import DEMO_POOL
from tests.router.load import other_requests

DRAFTER, MIDDLE, TARGET = "stdlib-1m", "stdlib-5m", "stdlib-29m"
NEW_TOKENS = 24


def test_settings_need_either_workers_or_models_in_process(tmp_path):
    with pytest.raises(ValidationError, match="no workers given.*--models-in-process"):
        RouterSettings(tokenizer_dir=tmp_path)
    with pytest.raises(ValidationError, match="give --pool-dir"):
        RouterSettings(tokenizer_dir=tmp_path, models_in_process=True)
    with pytest.raises(ValidationError, match="takes no workers"):
        RouterSettings(tokenizer_dir=tmp_path, models_in_process=True, pool_dir=tmp_path, workers=["h:1"])
    assert RouterSettings(tokenizer_dir=tmp_path, workers=["h:1"]).workers == ["h:1"]


def test_router_refuses_a_pool_directory_that_is_not_one(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specrouter.router", "--models-in-process", "true",
                           "--pool-dir", str(tmp_path), "--tokenizer-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"router: {tmp_path / 'pool.json'} does not exist" in done.stderr


class Recording:
    """A stand-in engine that records each call's arguments and thread."""

    def __init__(self):
        self.name, self.address, self.info = "m", "in-process:m", None
        self.calls: list[tuple] = []
        self.threads: list[str] = []

    def _call(self, *args):
        self.calls.append(args)
        self.threads.append(threading.current_thread().name)
        if args and args[0] == "boom":
            raise RuntimeError("refused")
        time.sleep(0.001)
        return StepResult(tokens=[[len(self.calls)]], rows=[None])

    prefill = draft = verify = release = _call


def test_every_engine_call_runs_on_the_compute_thread():
    compute, stop, engine = ComputeLoop(), threading.Event(), Recording()
    loop = threading.Thread(target=compute.run, args=(stop,), name="compute")
    loop.start()
    try:
        worker = EngineOnComputeThread(engine, compute)
        step = RowStep("r", [1], SamplingParams(), 0)
        row = VerifyRow("r", [1], SamplingParams(), 1, rollback=0, proposal=[2])
        results = [worker.prefill("s", [("r", [1, 2])], 1), worker.draft("s", 0, 3, [step], False),
                   worker.verify("s", 1, [row], True)]
        worker.release("s", ["r"])
        with pytest.raises(RuntimeError, match="refused"):   # an engine's error reaches the caller as it was
            worker.prefill("boom", [])
    finally:
        stop.set()
        loop.join()
    assert engine.calls == [("s", [("r", [1, 2])], 1), ("s", 0, 3, [step], False), ("s", 1, [row], True),
                            ("s", ["r"]), ("boom", [], 0)]
    assert engine.threads == ["compute"] * 5
    assert [r.tokens for r in results] == [[[1]], [[2]], [[3]]]
    assert all(r.handler_ns >= 1_000_000 for r in results)   # the engine's time on the compute thread
    assert worker.remote is False and worker.address == "in-process:m"


def test_engines_carry_what_a_worker_says_of_its_model():
    engines = load_pool_engines(DEMO_POOL)
    pool = InProcessPool.open(DEMO_POOL)
    assert set(engines) == set(pool.engines)
    for name, engine in engines.items():
        info = engine.info
        assert info.model_name == name and info.parameters == pool.parameters[name]
        assert len(info.tokenizer_sha256) == 64   # the router checks the pool shares the target's tokenizer
        assert {(f.batch_size, f.tokens_per_row) for f in info.warmup_forwards} >= {(1, 1), (16, 9)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = LocalCluster(DEMO_POOL, tmp_path_factory.mktemp("logs"), models_in_router=True, gateway_port=None)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_cluster_without_workers_serves_every_chain_with_the_targets_output(cluster):
    assert [s.name for s in cluster.services] == ["profiler", "router"]
    pool = InProcessPool.open(DEMO_POOL)
    prompts = heldout_code_prompts(3)
    expected = [g.token_ids for g in pool.generate(prompts, [TARGET], 0, SamplingParams(), NEW_TOKENS)]
    with Client(cluster.router.address) as client:
        models = {m.name: m for m in client.models()}
        assert {DRAFTER, MIDDLE, TARGET} <= set(models)
        assert models[TARGET].address.startswith(f"in-process:{TARGET}")   # no worker process
        for chain, window in [(TARGET, 0), (f"{DRAFTER},{TARGET}", 3), (f"{DRAFTER},{MIDDLE},{TARGET}", 2),
                              (f"{LOOKUP},{DRAFTER},{TARGET}", 4), ("auto", 0)]:
            got = [client.generate(p, max_new_tokens=NEW_TOKENS, chain=chain, window=window).token_ids
                   for p in prompts]
            assert got == expected, chain
        result = client.generate(prompts[0], max_new_tokens=NEW_TOKENS, chain=f"{DRAFTER},{TARGET}", window=3)
    target = result.stats.breakdown.levels[TARGET]
    assert target.calls == result.stats.cycles
    # the engine's time on the compute thread stands for a worker's handler: it holds the forward passes and
    # the call (the hand-off to that thread on top) holds it
    assert 0 < target.forward_ns <= target.handler_ns <= target.call_ns


def test_a_seed_pins_the_text_and_a_stop_string_ends_it_while_other_requests_come_and_go(cluster):
    """In the router's own process as through workers: a seeded sampled request gives the same token ids under
    target-only, static chains and auto while other requests join and leave the batches, and a stop string
    ends a greedy request on the target's tokens."""
    prompts = heldout_code_prompts(5)
    configurations = [(TARGET, 0), (f"{DRAFTER},{TARGET}", 3), (f"{LOOKUP},{DRAFTER},{TARGET}", 3), ("auto", 0)]
    with Client(cluster.router.address) as client:
        with other_requests(client, prompts[3:5], loaders=2, min_tokens=6, token_spread=9):
            for prompt, seed in [(prompts[0], 7), (prompts[1], 2**40 + 11)]:
                texts = {(chain, window): client.generate(prompt, max_new_tokens=NEW_TOKENS, temperature=0.8,
                                                          top_p=0.95, seed=seed, chain=chain,
                                                          window=window).token_ids
                         for chain, window in configurations}
                assert len({tuple(t) for t in texts.values()}) == 1, (seed, texts)
        free = client.generate(prompts[2], max_new_tokens=NEW_TOKENS, chain=TARGET)
        decode = load_tokenizer(DEMO_POOL / TARGET).decode
        # two tokens from the middle of the free output that do not occur before it
        stop = next(s for i in range(6, NEW_TOKENS - 2)
                    if (s := decode(free.token_ids[i:i + 2])).strip() and s not in decode(free.token_ids[:i]))
        got = client.generate(prompts[2], max_new_tokens=NEW_TOKENS, chain=f"{DRAFTER},{TARGET}", window=4,
                              stop=[stop])
    assert got.finish_reason == "stop" and stop in got.text
    assert got.token_ids == free.token_ids[:len(got.token_ids)]
    assert stop not in decode(got.token_ids[:-1])   # nothing kept past the stop
