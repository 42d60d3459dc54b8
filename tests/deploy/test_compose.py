"""docker-compose.yml: valid under the compose specification, and every SpecRouter service's command,
healthcheck and environment accepted by the real CLI and consistent with one another."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.deploy.commands import (REPO_ROOT, listens_everywhere, parse_healthcheck, parse_serve,
                                   repo_path_of_image_path)

COMPOSE = REPO_ROOT / "docker-compose.yml"
DEMO_POOL = REPO_ROOT / "models" / "demo-pool"


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]   # anchors and merge keys resolved


@pytest.fixture(scope="module")
def commands(services) -> dict:
    """Each SpecRouter service's command, parsed as its container would run it."""
    return {name: parse_serve(s["command"], s.get("environment", {}))
            for name, s in services.items() if s.get("image", "").startswith("specrouter:")}


def check_jsonschema(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_compose_file_is_valid_under_the_compose_specification():
    result = check_jsonschema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


def test_the_schema_check_refuses_a_broken_file(tmp_path):
    """The check above can fail: a misspelt key of a service is refused."""
    data = yaml.safe_load(COMPOSE.read_text())
    data["services"]["router"]["depends_onn"] = data["services"]["router"].pop("depends_on")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(json.dumps(data))
    result = check_jsonschema(broken)
    assert result.returncode == 1 and "depends_onn" in result.stdout


def test_services(services, commands):
    assert {"redis", "jaeger"} <= set(services)
    kinds = sorted(c.service for c in commands.values())
    assert kinds == ["gateway", "profiler", "router", "worker", "worker", "worker"]


def test_one_cpu_worker_per_demo_pool_model(commands):
    pool = json.loads((DEMO_POOL / "pool.json").read_text())
    workers = {c.settings.model_name: c.settings for c in commands.values() if c.service == "worker"}
    assert sorted(workers) == sorted(m["name"] for m in pool["members"])
    for member in pool["members"]:
        settings = workers[member["name"]]
        assert repo_path_of_image_path(settings.model_dir) == DEMO_POOL / member["path"]
        assert (DEMO_POOL / member["path"] / "config.json").exists()
        assert settings.device == "cpu"
        # as `specrouter up`: the target keeps PyTorch's threads, the others one each
        assert settings.torch_threads == (0 if member["name"] == pool["target"] else 1)


def test_services_listen_where_their_healthcheck_and_peers_look(services, commands):
    for name, command in commands.items():
        settings = command.settings
        assert listens_everywhere(settings.host), f"{name} listens on {settings.host} only"
        check = services[name]["healthcheck"]
        assert check["test"][:2] == ["CMD", "specrouter"], name
        params = parse_healthcheck(check["test"][2:])
        where = f"127.0.0.1:{settings.port}"
        if command.service == "gateway":   # HTTP: its /health, which answers 200 while the router serves
            where = f"http://{where}/health"
        assert params["address"] == where, name
        assert params["timeout"] < int(check["timeout"].rstrip("s")), f"{name}: the check outlives its timeout"


def test_router_reaches_every_worker_and_the_profiler(services, commands):
    router = commands["router"].settings
    pool = json.loads((DEMO_POOL / "pool.json").read_text())
    by_model = {c.settings.model_name: name for name, c in commands.items() if c.service == "worker"}
    assert sorted(router.workers) == sorted(f"{by_model[m]}:{commands[by_model[m]].settings.port}" for m in by_model)
    assert router.target == pool["target"]
    assert repo_path_of_image_path(router.tokenizer_dir) == DEMO_POOL / pool["target"]
    assert repo_path_of_image_path(router.pool_dir) == DEMO_POOL
    assert router.profiler == f"profiler:{commands['profiler'].settings.port}"
    assert services["router"]["ports"] == [f"127.0.0.1:{router.port}:{router.port}",
                                           f"127.0.0.1:{router.metrics_port}:{router.metrics_port}"]


def test_every_service_serves_its_metrics_on_a_port_of_its_own(commands):
    """A fixed port a Prometheus on the compose network scrapes, apart from the gRPC port."""
    for name, command in commands.items():
        settings = command.settings
        assert settings.metrics_port > 0 and settings.metrics_port != settings.port, name


def test_router_waits_for_healthy_workers_and_profiler(services, commands):
    depends = services["router"]["depends_on"]
    for name, command in commands.items():
        if command.service in ("worker", "profiler"):
            assert depends[name] == {"condition": "service_healthy"}, name
            assert "healthcheck" in services[name]


def test_profiler_uses_the_compose_redis(services, commands):
    assert commands["profiler"].settings.redis_url == "redis://redis:6379/0"
    assert services["profiler"]["depends_on"]["redis"] == {"condition": "service_healthy"}


def test_traces_go_to_jaeger_under_each_services_name(services, commands):
    jaeger = services["jaeger"]
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert "127.0.0.1:16686:16686" in jaeger["ports"]
    names = set()
    for name, command in commands.items():
        env = services[name]["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
        names.add(env["OTEL_SERVICE_NAME"])
        if command.service == "worker":
            assert env["OTEL_SERVICE_NAME"] == f"specrouter-worker-{command.settings.model_name}"
    assert len(names) == len(commands)


def test_services_run_hardened(services, commands):
    for name in commands:
        s = services[name]
        assert s["read_only"] is True and "/tmp" in s["tmpfs"]
        assert s["cap_drop"] == ["ALL"] and "no-new-privileges:true" in s["security_opt"]


def test_gateway_fronts_the_router_with_the_targets_tokenizer(services, commands):
    gateway, router = commands["gateway"].settings, commands["router"].settings
    assert gateway.router == f"router:{router.port}"
    assert gateway.tokenizer_dir == router.tokenizer_dir
    assert services["gateway"]["ports"] == [f"127.0.0.1:{gateway.port}:{gateway.port}"]
    assert services["gateway"]["depends_on"]["router"] == {"condition": "service_healthy"}
