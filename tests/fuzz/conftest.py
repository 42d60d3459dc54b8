"""Live services for the fuzz tests, each a real process on port 0, and the hypothesis settings.

The pool is the demo pool's smallest models: the 1M drafter, the same checkpoint served a second time
under another name (so that three-level chains, and with them intermediate levels, cost almost nothing),
and the 5M model as the target. A quick run (`FAST`, 40 examples) is what `pytest -m "not slow"` runs;
the tests marked slow run the same properties over `SLOW.max_examples` examples more, so that the full
suite draws SPECROUTER_FUZZ_EXAMPLES examples of each property in all (80 by default: the quick run's 40
and the long run's 40, about a minute and a quarter on two cores; a few thousand for a long hunt).
`--hypothesis-show-statistics` prints how many examples each test ran.
"""

from __future__ import annotations

import os

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings

from specrouter.launcher import ServiceProcess
from tests.conftest import DEMO_POOL

DRAFTER, COPY, TARGET = "stdlib-1m", "stdlib-1m-copy", "stdlib-5m"
MODELS = (DRAFTER, COPY, TARGET)
VOCAB = 4096
CALL_TIMEOUT_S = 120.0   # a call that has not answered by then is a hang: the property fails on it
# the router's limits for the fuzz: small enough that a request costs a fraction of a second
DEFAULT_MAX_NEW_TOKENS, MAX_NEW_TOKENS = 16, 48

FAST = settings(max_examples=40, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                       # the fixtures that check the services after a test run once per test
                                       HealthCheck.function_scoped_fixture])
SLOW = settings(FAST, max_examples=max(1, int(os.environ.get("SPECROUTER_FUZZ_EXAMPLES", "80")) - FAST.max_examples))


def worker(logs, model: str, name: str | None = None) -> ServiceProcess:
    args = ["--model-dir", str(DEMO_POOL / model), "--port", "0", "--threads", "8"]
    return ServiceProcess("specrouter.worker", *args, *(["--name", name] if name else []), log_dir=logs,
                          name=name or model)


@pytest.fixture(scope="package")
def pool(tmp_path_factory):
    """The three workers, {name: process}."""
    logs = tmp_path_factory.mktemp("fuzz-workers")
    procs: dict[str, ServiceProcess] = {}
    try:
        procs[DRAFTER] = worker(logs, DRAFTER)
        procs[COPY] = worker(logs, DRAFTER, COPY)
        procs[TARGET] = worker(logs, TARGET)
        yield procs
    finally:
        for p in procs.values():
            p.stop()


@pytest.fixture(scope="package")
def router(pool, tmp_path_factory):
    """`python -m specrouter.router` over the pool; yields the process."""
    logs = tmp_path_factory.mktemp("fuzz-router")
    proc = ServiceProcess("specrouter.router", "--workers", ",".join(p.address for p in pool.values()),
                          "--tokenizer-dir", str(DEMO_POOL / TARGET), "--target", TARGET, "--port", "0",
                          "--default-max-new-tokens", str(DEFAULT_MAX_NEW_TOKENS),
                          "--max-new-tokens", str(MAX_NEW_TOKENS), log_dir=logs)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="package")
def router_channel(router):
    with grpc.insecure_channel(router.address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        yield channel


def quick_and_long(prop, *examples, **strategies):
    """Two tests of the property `prop(fixture, **drawn)`: a quick run (FAST) with the explicit `examples`
    (the bugs the fuzz found), and a slow-marked long run (SLOW) that starts from the same examples and
    draws new ones (hypothesis keeps no database here, so its draws are not the quick run's)."""
    for add_example in examples:
        prop = add_example(prop)
    quick = FAST(given(**strategies)(prop))
    long = pytest.mark.slow(SLOW(given(**strategies)(prop)))
    return quick, long


def call(method, request) -> tuple[grpc.StatusCode, str, object]:
    """Calls `method` (a stub's, or a raw one that takes bytes); its status, message and reply."""
    try:
        return grpc.StatusCode.OK, "", method(request, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as err:
        return err.code(), err.details() or "", None


def check_status(what: str, code: grpc.StatusCode, details: str, acceptable: set[grpc.StatusCode]) -> None:
    """The property every call of the fuzz keeps: an acceptable status, and a message with every refusal."""
    event(f"{what.split()[0]}: {code.name}")   # the share of each outcome, in the statistics
    assert code in acceptable, f"{what} ended {code.name}: {details}"
    assert code == grpc.StatusCode.OK or details.strip(), f"{what} refused with {code.name} and no message"
