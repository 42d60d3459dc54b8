"""Workers as separate processes over gRPC: the same tokens as in process, errors as status codes."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrouter.pool.load import PoolDir
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.row import Row
from specrouter.inprocess import InProcessPool
from specrouter.router.remote import RemoteWorker
from specrouter.v1 import worker_pb2 as pb
from specrouter.contract.calls import SamplingParams
from tests.conftest import DEMO_POOL
from specrouter.launcher import ServiceProcess

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    pool = PoolDir.open(DEMO_POOL)
    logs = tmp_path_factory.mktemp("worker-logs")
    procs = [ServiceProcess("specrouter.worker", "--model-dir", str(pool.model_dir(n)), "--port", "0",
                            "--threads", "4", log_dir=logs, name=n) for n in pool.names]
    remotes = {}
    try:
        for p in procs:
            w = RemoteWorker(p.address)
            remotes[w.name] = w
        yield remotes, procs
    finally:
        for w in remotes.values():
            w.close()
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def local() -> InProcessPool:
    return InProcessPool.open(DEMO_POOL)


def run(workers, target, context, prompts, chain, window, params):
    batch = ChainBatch(workers, target, context)
    batch.add([Row(f"r{i}", p, len(p), params, NEW_TOKENS) for i, p in enumerate(prompts)])
    done = run_to_completion(batch, lambda _: (chain, window))
    return [done[f"r{i}"].generated for i in range(len(prompts))]


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95, seed=5)],
                         ids=["greedy", "sampling"])
def test_remote_chain_matches_in_process(workers, local, params) -> None:
    remotes, _ = workers
    prompts = [local.encode(p) for p in heldout_code_prompts(6)[:4]]
    small, mid = local.by_size()[:2]
    for chain, window in [((local.target,), 1), ((small, local.target), 4), ((small, mid, local.target), 3)]:
        here = run(local.engines, local.target, local.context_length, prompts, chain, window, params)
        there = run(remotes, local.target, local.context_length, prompts, chain, window, params)
        assert there == here, chain
    for name, w in remotes.items():
        assert w.stub.Info(pb.InfoRequest()).live_states == 0, name


def test_prefill_guesses_cross_the_wire(workers, local) -> None:
    """The models' guesses on a prompt, asked for at prefill, come back as the engine computes them."""
    remotes, _ = workers
    prompt = local.encode(heldout_code_prompts(2)[1])
    for name, w in remotes.items():
        there = w.prefill("guesses", [("a", prompt), ("b", prompt[:5])], predictions=16)
        here = local.engines[name].prefill("guesses", [("a", prompt), ("b", prompt[:5])], predictions=16)
        w.release("guesses")
        local.engines[name].release("guesses")
        assert there.tokens == here.tokens and [len(t) for t in there.tokens] == [16, 5], name


def test_health_info_and_status_codes(workers) -> None:
    remotes, procs = workers
    w = next(iter(remotes.values()))
    health = health_pb2_grpc.HealthStub(w.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="specrouter.v1.WorkerService")).status == \
        health_pb2.HealthCheckResponse.SERVING
    info = w.stub.Info(pb.InfoRequest())
    assert info.vocab_size == 4096 and info.dtype == "float32" and len(info.tokenizer_sha256) == 64
    # the warm-up latency profile: one forward per (batch size, tokens per row) of the default grid
    grid = {(f.batch_size, f.tokens_per_row) for f in info.warmup_forwards}
    assert grid == {(b, k) for b in (1, 2, 4, 8, 16) for k in (1, 2, 3, 4, 5, 7, 9)}
    assert all(f.forward_ns > 0 and f.tokens_valid == f.batch_size * f.tokens_per_row for f in info.warmup_forwards)
    greedy = pb.Sampling(top_p=1.0, repetition_penalty=1.0)
    cases = [
        (pb.DraftRequest(state_id="missing", window=1, rows=[pb.RowStep(row_id="a", pending_tokens=[1], sampling=greedy)]),
         grpc.StatusCode.NOT_FOUND, "no state"),
        (pb.DraftRequest(state_id="s", window=1, rows=[pb.RowStep(row_id="a", pending_tokens=[1],
                                                                 sampling=pb.Sampling(top_p=0.0, repetition_penalty=1.0))]),
         grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
        (pb.DraftRequest(state_id="s", window=1, rows=[pb.RowStep(row_id="zz", pending_tokens=[1], sampling=greedy)]),
         grpc.StatusCode.FAILED_PRECONDITION, "holds"),
        (pb.DraftRequest(state_id="s", window=2000, rows=[pb.RowStep(row_id="a", pending_tokens=[1], sampling=greedy)]),
         grpc.StatusCode.OUT_OF_RANGE, "context"),
    ]
    w.stub.Prefill(pb.PrefillRequest(state_id="s", rows=[pb.PrefillRow(row_id="a", tokens=[5, 6])]))
    for request, code, words in cases:
        with pytest.raises(grpc.RpcError) as err:
            w.stub.Draft(request)
        assert err.value.code() == code and words in err.value.details()
    w.stub.Release(pb.ReleaseRequest(state_id="s"))
    assert w.stub.Info(pb.InfoRequest()).live_states == 0   # still up and answering
    for p in procs:
        assert p.proc.poll() is None


def test_sigterm_stops_a_worker_cleanly(tmp_path) -> None:
    pool = PoolDir.open(DEMO_POOL)
    smallest = pool.model_dir(pool.names[-1])
    proc = ServiceProcess("specrouter.worker", "--model-dir", str(smallest), log_dir=tmp_path)
    assert proc.stop() == 0
    assert "stopped" in proc.log_path.read_text()
