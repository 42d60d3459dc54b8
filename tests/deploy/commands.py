"""What a container runs, parsed by the real command line: `specrouter serve SERVICE FLAGS...` through the
`specrouter` CLI and then the service's own settings parser, with the container's environment in place
of this process's (the settings read SPECROUTER_<SERVICE>_* variables). Nothing is started."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import typer

from specrouter.cli import app
from specrouter.gateway import __main__ as gateway_main
from specrouter.gateway.settings import GatewaySettings
from specrouter.profiler import __main__ as profiler_main
from specrouter.profiler.settings import ProfilerSettings
from specrouter.router import __main__ as router_main
from specrouter.router.replicas import parse_address
from specrouter.router.settings import RouterSettings
from specrouter.worker import __main__ as worker_main
from specrouter.worker.settings import WorkerSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI: click.Group = typer.main.get_command(app)
SETTINGS = {"router": RouterSettings, "worker": WorkerSettings, "profiler": ProfilerSettings,
            "gateway": GatewaySettings}
# The environment a service reads besides its settings: OpenTelemetry's standard variables (tracing.py)
# and GNU OpenMP's spin count (CPU workers).
OTHER_ENV = {"OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_INSECURE",
             "OTEL_TRACES_EXPORTER", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_PYTHON_GRPC_EXCLUDED_SERVICES",
             "GOMP_SPINCOUNT"}
# The image's demo pool (Dockerfile: COPY models/demo-pool /models/demo-pool)
IMAGE_DEMO_POOL = Path("/models/demo-pool")


@dataclass
class ServiceCommand:
    service: str        # router, worker, profiler or gateway
    settings: Any       # its settings object, as its main would build it


def cli_context(argv: Sequence[str]) -> click.Context:
    """`specrouter ARGV...` parsed by the CLI's own parser (click raises UsageError on what it refuses)."""
    assert argv, "an empty command"
    name, *rest = argv
    assert name in CLI.commands, f"`specrouter {name}` is not a command; the CLI has {sorted(CLI.commands)}"
    return CLI.commands[name].make_context(f"specrouter {name}", list(rest))


@contextmanager
def service_environment(env: Mapping[str, str]) -> Iterator[None]:
    """This process's SPECROUTER_* variables replaced by `env`'s for the duration."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("SPECROUTER_")}
    for k in saved:
        del os.environ[k]
    os.environ.update({k: v for k, v in env.items() if k.startswith("SPECROUTER_")})
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("SPECROUTER_")]:
            del os.environ[k]
        os.environ.update(saved)


def check_environment(service: str, env: Mapping[str, str]) -> None:
    """Every variable is one the service reads: a field of its settings or one of OTHER_ENV."""
    prefix = SETTINGS[service].model_config["env_prefix"]
    fields = {prefix + name.upper() for name in SETTINGS[service].model_fields}
    unknown = sorted(k for k in env if k not in fields and k not in OTHER_ENV)
    assert not unknown, f"{service}: {unknown} are read by nothing (settings take {sorted(fields)})"


def parse_serve(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ServiceCommand:
    """`specrouter serve SERVICE FLAGS...` as the service's main parses it, under environment `env`."""
    env = dict(env or {})
    ctx = cli_context(argv)
    assert ctx.command.name == "serve", f"{list(argv)} does not run a service"
    service, flags = ctx.params["service"], list(ctx.args)
    assert service in SETTINGS, f"unknown service {service!r}"
    check_environment(service, env)
    with service_environment(env):
        try:
            if service == "router":
                settings = router_main.parse_settings(flags)
            elif service == "worker":
                settings = worker_main.parse_settings(flags)
            elif service == "gateway":
                settings = gateway_main.parse_settings(flags)
            else:   # as the profiler's main builds its settings from its flags
                given = vars(profiler_main._parse(flags))
                settings = ProfilerSettings(**{k: v for k, v in given.items() if k != "verbose" and v is not None})
        except SystemExit as exc:   # argparse refused a flag (its message is on stderr)
            raise AssertionError(f"`specrouter serve {service}` refuses {flags}") from exc
    return ServiceCommand(service, settings)


def parse_healthcheck(argv: Sequence[str]) -> dict[str, Any]:
    """`specrouter healthcheck ADDRESS ...` parsed by the CLI: its parameters."""
    ctx = cli_context(argv)
    assert ctx.command.name == "healthcheck", f"{list(argv)} is not a health check"
    return ctx.params


def port_of(address: str) -> int:
    """The port of HOST:PORT or dns:///HOST:PORT, as the router reads it."""
    return parse_address(address).port


def host_of(address: str) -> str:
    """The host (a Service's name) of HOST:PORT or dns:///HOST:PORT, as the router reads it."""
    return parse_address(address).host


def repo_path_of_image_path(path: Path) -> Path:
    """Where a path of the image's demo pool comes from in this repository."""
    return REPO_ROOT / "models" / "demo-pool" / Path(path).relative_to(IMAGE_DEMO_POOL)


def listens_everywhere(host: str) -> bool:
    """A container's service must listen on every interface, not only its own loopback."""
    return host in ("0.0.0.0", "[::]", "::")
