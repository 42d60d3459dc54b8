"""Scale-out on one machine, as in a cluster: two routers over two replicas of each demo-pool model (every
worker a process on a port of its own), one profiler over one Redis. Clients send concurrent greedy requests,
spread over both routers by the SDK's round robin; mid-run one replica of the target and then one of a
drafter are killed (SIGKILL): the target's replica is the one a long request is generating on, the drafter's
one that holds rows at that moment. No request is lost, every output is the target's own, and once no
replica of the target is left a request fails UNAVAILABLE naming it."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from specrouter.client import Client, SpecRouterError, UnavailableError
from specrouter.launcher import ServiceProcess
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.v1 import worker_pb2, worker_pb2_grpc
from tests.conftest import DEMO_POOL
from tests.metrics.scrape import scrape

TARGET, DRAFTERS = "stdlib-29m", ("stdlib-5m", "stdlib-1m")
REPLICAS = 2
CLIENTS = 6
REQUESTS = 36
NEW_TOKENS = 32
HOLD_TOKENS = 256   # a request that is sure to be generating on its target replica when that is killed
WAIT_S = 300.0   # bound on start-ups and on the run on a loaded machine (not a timing assertion)
# the latency profile at start-up: one shape, not the grid; every worker on one thread (twelve share the cores)
WORKER_ENV = {"SPECROUTER_WORKER_PROFILE_BATCH_SIZES": "[1]", "SPECROUTER_WORKER_PROFILE_TOKENS_PER_ROW": "[1]",
              "GOMP_SPINCOUNT": "20000"}


def start_all(starts: dict) -> dict[str, ServiceProcess]:
    """Starts the services together (most of a start is imports); if one fails, the others are stopped."""
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = {name: pool.submit(start) for name, start in starts.items()}
    procs = {name: f.result() for name, f in futures.items() if f.exception() is None}
    failures = [f.exception() for f in futures.values() if f.exception() is not None]
    if failures:
        for p in procs.values():
            p.stop()
        raise failures[0]
    return procs


@pytest.fixture()
def cluster(tmp_path, shared_redis):
    logs = tmp_path / "logs"
    starts = {"profiler": lambda: ServiceProcess("specrouter.profiler", "--host", "127.0.0.1", "--port", "0",
                                                 "--redis-url", shared_redis.url, "--key-prefix", "scale-out",
                                                 log_dir=logs)}
    for model in (TARGET, *DRAFTERS):
        for i in range(REPLICAS):
            starts[f"{model}-{i}"] = lambda model=model, i=i: ServiceProcess(
                "specrouter.worker", "--model-dir", str(DEMO_POOL / model), "--port", "0", "--torch-threads", "1",
                log_dir=logs, name=f"{model}-{i}", env=WORKER_ENV)
    procs = start_all(starts)
    try:
        # every replica by its address; the first of the target by a name that resolves to it, in gRPC's spelling
        workers = [f"dns:///localhost:{procs[f'{TARGET}-0'].address.rsplit(':', 1)[1]}"]
        workers += [p.address for name, p in procs.items() if name not in ("profiler", f"{TARGET}-0")]
        router_args = ("--workers", ",".join(workers), "--tokenizer-dir", str(DEMO_POOL / TARGET), "--target", TARGET,
                       "--profiler", procs["profiler"].address, "--pool-dir", str(DEMO_POOL), "--port", "0",
                       "--workers-resolve-s", "1", "--target-wait-s", "3")
        procs |= start_all({name: lambda name=name: ServiceProcess("specrouter.router", *router_args, log_dir=logs,
                                                                   name=name)
                            for name in ("router-a", "router-b")})
        yield procs
    finally:
        with ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(ServiceProcess.stop, procs.values()))


def rows_on(service: ServiceProcess) -> float:
    return scrape(service.metrics_url).value("specrouter_worker_rows")


def one_holding_rows(procs: dict[str, ServiceProcess], models: tuple[str, ...]) -> tuple[str, int]:
    """A replica of one of `models` that holds rows (requests in flight on it): its name and rows."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for name, service in procs.items():
            if name.rsplit("-", 1)[0] in models and service.alive():
                rows = rows_on(service)
                if rows:
                    return name, int(rows)
        time.sleep(0.05)
    raise AssertionError(f"no replica of {models} held rows within {WAIT_S:.0f} s")


def kill(service: ServiceProcess) -> None:
    os.kill(service.proc.pid, signal.SIGKILL)
    service.proc.wait(30)


def kill_one_holding_rows(procs: dict[str, ServiceProcess], models: tuple[str, ...]) -> tuple[str, int]:
    """SIGKILLs a replica of one of `models` while it holds rows: its name and rows."""
    name, rows = one_holding_rows(procs, models)
    kill(procs[name])
    return name, rows


@pytest.mark.slow
def test_two_routers_over_two_replicas_lose_no_request_when_replicas_are_killed(cluster, capsys) -> None:
    routers = f"ipv4:{cluster['router-a'].address},{cluster['router-b'].address}"
    prompts = heldout_code_prompts(6)
    with Client(cluster["router-a"].address, timeout_s=WAIT_S) as client:
        expected = [client.generate(p, max_new_tokens=NEW_TOKENS, chain="target").token_ids for p in prompts]
        expected_held = client.generate(prompts[0], max_new_tokens=HOLD_TOKENS, chain="target").token_ids

    work: queue.Queue[int] = queue.Queue()
    for i in range(REQUESTS):
        work.put(i)
    outputs: dict[int, list[int]] = {}
    failures: dict[int, SpecRouterError] = {}

    def ask() -> None:
        with Client(routers, timeout_s=WAIT_S) as client:   # round robin over both routers
            while True:
                try:
                    i = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    outputs[i] = client.generate(prompts[i % len(prompts)], max_new_tokens=NEW_TOKENS).token_ids
                except SpecRouterError as exc:
                    failures[i] = exc

    held: dict[str, list[int] | SpecRouterError] = {}

    def hold() -> None:
        with Client(cluster["router-a"].address, timeout_s=WAIT_S) as client:
            try:
                held["ids"] = client.generate(prompts[0], max_new_tokens=HOLD_TOKENS).token_ids
            except SpecRouterError as exc:
                held["ids"] = exc

    before = {r: scrape(cluster[r].metrics_url) for r in ("router-a", "router-b")}
    # a long request alone first: the target replica that holds rows is its own, and it is still generating
    # there when the replica is killed, so its batch must move
    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    killed_target, _ = one_holding_rows(cluster, (TARGET,))
    clients = [threading.Thread(target=ask, daemon=True) for _ in range(CLIENTS)]
    for c in clients:
        c.start()
    target_rows = int(rows_on(cluster[killed_target]))
    kill(cluster[killed_target])
    finished = len(outputs) + len(failures)
    while len(outputs) + len(failures) < finished + 2 and any(c.is_alive() for c in clients):
        time.sleep(0.05)
    killed_drafter, drafter_rows = kill_one_holding_rows(cluster, DRAFTERS)
    for c in [*clients, holder]:
        c.join(WAIT_S)
        assert not c.is_alive(), "a request hung"

    served = {r: scrape(cluster[r].metrics_url).total("specrouter_grpc_server_handled_total", grpc_method="Generate",
                                                       grpc_code="OK")
              - before[r].total("specrouter_grpc_server_handled_total", grpc_method="Generate", grpc_code="OK")
              for r in ("router-a", "router-b")}
    moved = [line for r in ("router-a", "router-b") for line in cluster[r].log_path.read_text().splitlines()
             if f"at {cluster[killed_target].address} failed" in line and "move to" in line]
    lost_held = int(isinstance(held["ids"], SpecRouterError))
    with capsys.disabled():
        print(f"\nscale-out: {REQUESTS + 1} requests from {CLIENTS + 1} clients over 2 routers (served "
              f"{served['router-a']:.0f} and {served['router-b']:.0f}), 2 replicas of each of {TARGET}, "
              f"{', '.join(DRAFTERS)}; killed "
              f"{killed_target} holding {target_rows} row(s) and {killed_drafter} holding {drafter_rows} row(s); "
              f"batches moved off the target replica: {len(moved)}; requests lost: {len(failures) + lost_held}")
    assert not failures, failures
    assert held["ids"] == expected_held, "the request on the killed target replica lost its way"
    assert sorted(outputs) == list(range(REQUESTS))
    assert all(outputs[i] == expected[i % len(prompts)] for i in outputs), "an output is not the target's own"
    assert all(served.values()) and sum(served.values()) == REQUESTS + 1, served
    assert moved, "no router moved a batch off the killed target replica"

    # the target's last replica killed: once no replica has answered for --target-wait-s, requests fail
    # UNAVAILABLE, naming it
    last = next(n for n in cluster if n.startswith(f"{TARGET}-") and n != killed_target)
    os.kill(cluster[last].proc.pid, signal.SIGKILL)
    cluster[last].proc.wait(30)
    with Client(routers, timeout_s=WAIT_S) as client:
        for _ in range(2):   # one call on each router
            with pytest.raises(UnavailableError) as err:
                client.generate(prompts[0], max_new_tokens=4)
            assert f"no replica of the target {TARGET} has answered for" in err.value.message, err.value.message


def test_a_router_over_replicas_that_disagree_does_not_start_and_says_which(tmp_path) -> None:
    """Two workers that call themselves one model but serve different checkpoints."""
    procs = start_all({m: lambda m=m: ServiceProcess("specrouter.worker", "--model-dir", str(DEMO_POOL / m), "--name",
                                                     "drafter", "--port", "0", log_dir=tmp_path, name=m,
                                                     env=WORKER_ENV) for m in DRAFTERS})
    try:
        first, second = (procs[m].address for m in DRAFTERS)
        sizes = []
        for address in (first, second):
            with grpc.insecure_channel(address) as channel:
                sizes.append(worker_pb2_grpc.WorkerServiceStub(channel).Info(worker_pb2.InfoRequest()).parameters)
        run = subprocess.run([sys.executable, "-m", "specrouter.router", "--workers", f"{first},{second}",
                              "--tokenizer-dir", str(DEMO_POOL / TARGET), "--port", "0"],
                             capture_output=True, text=True, timeout=WAIT_S)
    finally:
        for p in procs.values():
            p.stop()
    assert run.returncode == 2, run.stderr
    said = re.search(r"router: the replicas of 'drafter' disagree: (.*)", run.stderr)
    assert said, run.stderr
    assert said.group(1).startswith(f"{second} has ") and said.group(1).endswith(
        f"parameters {sizes[1]} != {sizes[0]} of {first}; every replica of a model must serve the same checkpoint")
