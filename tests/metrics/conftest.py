"""Real services, each a process on port 0 with its metrics on a free port: the profiler (in memory), the
demo pool's two smallest models (stdlib-1m drafting for stdlib-5m, the target) and a router over them.
The profiler and the workers start together, as they would in a cluster: most of a start is imports."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from specrouter.launcher import ServiceProcess
from specrouter.v1 import router_pb2_grpc
from tests.conftest import DEMO_POOL

DRAFTER, TARGET = "stdlib-1m", "stdlib-5m"
# the latency profile at start-up: one shape, not the grid (the tests need no scheduler prior)
SMALL_WARM_UP = {"SPECROUTER_WORKER_PROFILE_BATCH_SIZES": "[1]", "SPECROUTER_WORKER_PROFILE_TOKENS_PER_ROW": "[1]"}


@pytest.fixture(scope="package")
def services(tmp_path_factory) -> dict[str, ServiceProcess]:
    """{"profiler": ..., DRAFTER: ..., TARGET: ..., "router": ...}"""
    logs = tmp_path_factory.mktemp("metrics-services")
    starts = {"profiler": lambda: ServiceProcess("specrouter.profiler", "--host", "127.0.0.1", "--port", "0",
                                                 log_dir=logs)}
    for model in (DRAFTER, TARGET):
        starts[model] = lambda model=model: ServiceProcess(
            "specrouter.worker", "--model-dir", str(DEMO_POOL / model), "--port", "0", "--threads", "4",
            log_dir=logs, name=model, env=SMALL_WARM_UP)
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = {name: pool.submit(start) for name, start in starts.items()}
    procs = {name: f.result() for name, f in futures.items() if f.exception() is None}
    failures = [f.exception() for f in futures.values() if f.exception() is not None]
    try:
        if failures:   # the services that did start are stopped below
            raise failures[0]
        procs["router"] = ServiceProcess(
            "specrouter.router", "--workers", f"{procs[DRAFTER].address},{procs[TARGET].address}",
            "--tokenizer-dir", str(DEMO_POOL / TARGET), "--target", TARGET, "--port", "0",
            "--profiler", procs["profiler"].address, "--snapshot-refresh-s", "0.2", log_dir=logs)
        yield procs
    finally:
        with ThreadPoolExecutor(len(procs) or 1) as pool:
            list(pool.map(ServiceProcess.stop, procs.values()))


@pytest.fixture(scope="package")
def router(services) -> ServiceProcess:
    return services["router"]


@pytest.fixture(scope="package")
def profiler(services) -> ServiceProcess:
    return services["profiler"]


@pytest.fixture(scope="package")
def workers(services) -> dict[str, ServiceProcess]:
    return {model: services[model] for model in (DRAFTER, TARGET)}


@pytest.fixture(scope="package")
def router_stub(router):
    with grpc.insecure_channel(router.address) as channel:
        yield router_pb2_grpc.RouterServiceStub(channel)
