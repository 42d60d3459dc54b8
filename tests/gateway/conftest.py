"""A live cluster for the gateway's tests: `specrouter up` as a user runs it, on a two-model pool made here from
the demo pool's two smallest models with a chat template added to the target's tokenizer, the router's
bearer token on, a line of three requests and none waiting (so that a fourth is refused), and traces sent
to a receiver of the test's own. The gateway runs as `up` starts it; tests that need another setting
start one more gateway in this process, on port 0, in front of the same router."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from specrouter import Client
from specrouter.gateway import chat
from specrouter.gateway.server import GatewayServer
from specrouter.gateway.settings import GatewaySettings
from specrouter.v1 import worker_pb2, worker_pb2_grpc
from tests.conftest import DEMO_POOL
from tests.traces import TraceReceiver, trace_endpoint
from tests.metrics.scrape import scrape

DRAFTER, TARGET = "stdlib-1m", "stdlib-5m"
TOKEN = "gateway-test-token"
MAX_IN_FLIGHT = 3
START_TIMEOUT_S = 300.0
WAIT_S = 30.0   # bound on polling for a state the services reach on their own (not a timing assertion)
# A conversation's turns as "role: content" lines after the BOS text, ending where the assistant answers;
# a conversation that starts with a tool's message is refused by the template itself.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'tool' %}{{ raise_exception('a conversation cannot start with a tool message') }}"
    "{% endif %}{{ bos_token }}{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def chat_pool(directory: Path) -> Path:
    """The demo pool's two smallest models as a pool of their own, the target's tokenizer with CHAT_TEMPLATE
    (the weights and tokenizers are links into the demo pool)."""
    members = []
    for name in (DRAFTER, TARGET):
        model_dir = directory / name
        model_dir.mkdir(parents=True)
        for f in (DEMO_POOL / name).iterdir():
            if f.name != "tokenizer_config.json":
                (model_dir / f.name).symlink_to(f)
        config = json.loads((DEMO_POOL / name / "tokenizer_config.json").read_text())
        if name == TARGET:
            config["chat_template"] = CHAT_TEMPLATE
        (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
        members.append({"name": name, "path": str(model_dir)})
    (directory / "pool.json").write_text(json.dumps({"target": TARGET, "members": members}))
    return directory


@dataclass
class Cluster:
    proc: subprocess.Popen
    router: str                 # HOST:PORT
    gateway: str                # HOST:PORT
    pool: Path
    metrics: dict[str, str]     # service name -> its /metrics URL
    workers: dict[str, str]     # model -> worker address
    traces: TraceReceiver
    lines: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://{self.gateway}/v1"


@pytest.fixture(scope="session")
def traces() -> Iterator[tuple[TraceReceiver, int]]:
    with trace_endpoint() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, traces) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("gateway")
    pool = chat_pool(root / "pool")
    token_file = root / "router.token"
    token_file.write_text(TOKEN + "\n")
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{traces[1]}",
           "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "200",
           "SPECROUTER_ROUTER_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT), "SPECROUTER_ROUTER_MAX_QUEUED": "0"}
    env.pop("SPECROUTER_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "specrouter.cli", "up", "--pool", str(pool), "--port", "0",
                             "--log-dir", str(root / "logs"), "--auth-token-file", str(token_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen, deadline = [], time.monotonic() + START_TIMEOUT_S
    while not any(line.startswith("gateway listening on ") for line in seen):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(seen[-40:])
        try:
            seen.append(lines.get(timeout=1.0))
        except queue.Empty:
            pass
    at = {name: address for name, _, address in (line.strip().partition(" up at ") for line in seen) if address}
    metrics = {name: url for name, _, url in (line.strip().partition(" metrics at ") for line in seen) if url}
    gateway = next(line.split()[-1] for line in seen if line.startswith("gateway listening on "))
    router = next(line.split()[-1] for line in seen if line.startswith("router listening on "))
    workers = {name.removeprefix("worker-"): a for name, a in at.items() if name.startswith("worker-")}
    yield Cluster(proc, router, gateway, pool, metrics, workers, traces[0], seen)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def sdk(cluster) -> Iterator[Client]:
    with Client(cluster.router, timeout_s=120, token=TOKEN) as client:
        yield client


@pytest.fixture(scope="session")
def openai_client(cluster):
    import openai

    with openai.OpenAI(base_url=cluster.base_url, api_key=TOKEN, max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def long_prompt(sdk) -> str:
    """A prompt whose greedy continuation runs 300 tokens without EOS."""
    for prompt in ("def parse(path):", "import os\nimport sys\n", "class Stack:", "for i in range(10):"):
        if sdk.generate(prompt, max_new_tokens=300, chain="target").finish_reason == "length":
            return prompt
    raise AssertionError("no prompt runs 300 tokens; pick others")


class InProcessGateway:
    """Another gateway, in this process, on port 0."""

    def __init__(self, **settings):
        self.settings = GatewaySettings(host="127.0.0.1", port=0, **settings)
        self.server = GatewayServer(self.settings, chat.load(self.settings.tokenizer_dir, self.settings.chat_template))
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def __enter__(self) -> InProcessGateway:
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()


def live_states(cluster: Cluster) -> dict[str, int]:
    out = {}
    for model, address in cluster.workers.items():
        with grpc.insecure_channel(address) as ch:
            out[model] = worker_pb2_grpc.WorkerServiceStub(ch).Info(worker_pb2.InfoRequest(), timeout=10).live_states
    return out


def wait_until(check, what: str):
    """Polls `check()` until it returns something true (the services get there on their own)."""
    deadline = time.monotonic() + WAIT_S
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S:g} s"
        time.sleep(0.05)
    return result


def router_calls(cluster: Cluster, method: str, code: str) -> float:
    """The router's count of RouterService `method` calls that ended with `code`."""
    return scrape(cluster.metrics["router"]).value("specrouter_grpc_server_handled_total",
                                                   grpc_service="specrouter.v1.RouterService", grpc_method=method,
                                                   grpc_code=code)


def released(cluster: Cluster) -> bool:
    """No request holds a place in the router and no worker holds a state."""
    router = scrape(cluster.metrics["router"])
    held = router.value("specrouter_router_requests_in_flight") + router.value("specrouter_router_requests_queued")
    return held == 0 and not any(live_states(cluster).values())
