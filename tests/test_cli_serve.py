"""`specrouter serve SERVICE --help` shows that service's own options, not the `serve` command's."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specrouter.cli import app

runner = CliRunner()
OWN_OPTIONS = {"router": "--workers", "worker": "--model-dir", "profiler": "--redis-url", "gateway": "--chat-template"}


@pytest.mark.parametrize("service", sorted(OWN_OPTIONS))
def test_a_services_help_lists_its_own_options(service) -> None:
    result = runner.invoke(app, ["serve", service, "--help"])
    assert result.exit_code == 0, result.output
    assert OWN_OPTIONS[service] in result.output and "--metrics-port" in result.output
    others = [flag for name, flag in OWN_OPTIONS.items() if name != service]
    assert not any(flag in result.output for flag in others), result.output


def test_serve_alone_shows_its_own_help_and_names_the_services() -> None:
    for args, code in ((["serve", "--help"], 0), (["serve"], 2)):
        result = runner.invoke(app, args)
        assert result.exit_code == code and "router, worker, profiler or gateway" in result.output
    unknown = runner.invoke(app, ["serve", "cache"])
    assert unknown.exit_code == 1 and "unknown service 'cache'" in unknown.output
