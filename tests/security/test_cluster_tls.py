"""`specrouter up` with TLS and a token, as a user runs it: every service over TLS, the router's token in
its environment alone, and the greedy tokens of the plaintext services."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specrouter import Client, ClientTLS, UnauthenticatedError
from tests.conftest import DEMO_POOL
from tests.security.conftest import DRAFTER, PROMPT, REQUEST, TARGET, TOKEN

START_TIMEOUT_S = 300


def two_model_pool(directory: Path) -> Path:
    """The demo pool's two smallest models, as a pool of their own (absolute paths into the demo pool)."""
    members = [{"name": n, "path": str(DEMO_POOL / n)} for n in (DRAFTER, TARGET)]
    (directory / "pool.json").write_text(json.dumps({"target": TARGET, "members": members}))
    return directory


def command_lines(pid: int) -> dict[int, list[str]]:
    """The argv of `pid`'s child processes."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(c): Path(f"/proc/{c}/cmdline").read_bytes().decode().split("\0") for c in children}


@pytest.mark.slow
def test_up_with_tls_and_a_token(pki, tmp_path, plain_tokens) -> None:
    env = {**os.environ, "SPECROUTER_ROUTER_AUTH_TOKEN": TOKEN}
    env.pop("SPECROUTER_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "specrouter.cli", "up", "--pool", str(two_model_pool(tmp_path)),
                             "--port", "0", "--log-dir", str(tmp_path / "logs"), "--tls-ca", str(pki.ca),
                             "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        address, deadline = None, time.monotonic() + START_TIMEOUT_S
        while address is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.startswith("router listening on "):
                address = line.split()[-1]
            elif not line and proc.poll() is not None:
                break
        assert address, f"specrouter up did not start: {proc.stderr.read()[-3000:]}"
        services = command_lines(proc.pid)
        assert len(services) == 5   # the profiler, two workers, the router, the gateway (HTTPS)
        for argv in services.values():
            assert "--tls-cert" in argv and not any(TOKEN in a for a in argv), argv
        tls = ClientTLS.from_files(pki.ca)
        with Client(address, timeout_s=120, tls=tls, token=TOKEN) as client:
            assert client.generate(PROMPT, **REQUEST).token_ids == plain_tokens
        with Client(address, timeout_s=10, tls=tls, token="") as client, pytest.raises(UnauthenticatedError):
            client.models()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
