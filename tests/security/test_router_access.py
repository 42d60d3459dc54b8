"""The router's public API over TLS with a bearer token, and its TLS to the workers: the same greedy tokens
as in plaintext, a clear error for each thing missing, and no token in a process's command line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from specrouter import AsyncClient, Client, ClientTLS, UnauthenticatedError, UnavailableError
from specrouter.launcher import ServiceProcess
from specrouter.tls import ServerTLS, channel
from specrouter.v1 import router_pb2, router_pb2_grpc
from tests.conftest import DEMO_POOL
from tests.security.conftest import DRAFTER, PROMPT, REQUEST, TARGET, TOKEN, router_server, rpc_code

CLI_TIMEOUT_S = 120


def upstream(pki) -> dict:
    return dict(upstream_ca=pki.ca, upstream_cert=pki.client_cert, upstream_key=pki.client_key)


@pytest.fixture(scope="module")
def tls_router(pki, tls_workers) -> Iterator[str]:
    """TLS on its public side (no client certificate asked), a token, mutual TLS to its workers."""
    tls = ServerTLS(pki.server_cert.read_bytes(), pki.server_key.read_bytes())
    with router_server(tls_workers, tls, TOKEN, **upstream(pki)) as address:
        yield address


def test_tls_all_the_way_gives_the_plaintext_tokens(pki, tls_router, plain_tokens) -> None:
    with Client(tls_router, timeout_s=60, tls=ClientTLS.from_files(pki.ca), token=TOKEN) as client:
        result = client.generate(PROMPT, **REQUEST)
        streamed = [t for chunk in client.generate_stream(PROMPT, **REQUEST) for t in chunk.token_ids]
        assert {m.name for m in client.models()} == {DRAFTER, TARGET}
    assert len(plain_tokens) == REQUEST["max_new_tokens"]
    assert result.token_ids == plain_tokens and streamed == plain_tokens


def test_a_client_that_does_not_speak_tls_or_trust_the_ca_is_refused(pki, tls_router) -> None:
    for tls in (None, ClientTLS.from_files(pki.other_ca)):
        with Client(tls_router, timeout_s=10, tls=tls, token=TOKEN) as client:
            with pytest.raises(UnavailableError):
                client.models()


def test_the_token_is_required_and_checked(pki, tls_router) -> None:
    tls = ClientTLS.from_files(pki.ca)
    for token, says in (("", "requires a bearer token"), ("wrong-token", "was not accepted")):   # "": send none
        with Client(tls_router, timeout_s=10, tls=tls, token=token) as client:
            with pytest.raises(UnauthenticatedError, match=says) as err:
                client.generate(PROMPT, **REQUEST)
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(UnauthenticatedError):
                list(client.generate_stream(PROMPT, **REQUEST))
            with pytest.raises(UnauthenticatedError):
                client.models()
    with Client(tls_router, timeout_s=10, tls=tls, token=TOKEN) as client:
        assert client.models()


def test_the_async_client_sends_its_token(pki, tls_router, plain_tokens) -> None:
    async def run(token):
        async with AsyncClient(tls_router, timeout_s=60, tls=ClientTLS.from_files(pki.ca), token=token) as client:
            return (await client.generate(PROMPT, **REQUEST)).token_ids

    assert asyncio.run(run(TOKEN)) == plain_tokens
    with pytest.raises(UnauthenticatedError):
        asyncio.run(run("wrong-token"))


def test_the_token_comes_from_a_file_or_the_environment(pki, tls_router, tmp_path, monkeypatch) -> None:
    tls = ClientTLS.from_files(pki.ca)
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    with Client(tls_router, timeout_s=10, tls=tls, token_file=path) as client:
        assert client.models()
    monkeypatch.setenv("SPECROUTER_TOKEN", TOKEN)
    with Client(tls_router, timeout_s=10, tls=tls) as client:
        assert client.models()


def test_health_and_reflection_stay_open(pki, tls_router) -> None:
    """Probes carry no token: health and reflection answer them; the API does not."""
    with channel(tls_router, ClientTLS.from_files(pki.ca)) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        answers = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        services = {s.name for a in answers for s in a.list_services_response.service}
        assert "specrouter.v1.RouterService" in services
        stub = router_pb2_grpc.RouterServiceStub(ch)
        assert rpc_code(lambda: stub.ListModels(router_pb2.ListModelsRequest(), timeout=10)) == \
            grpc.StatusCode.UNAUTHENTICATED


def test_a_router_that_asks_for_client_certificates(pki, tls_workers) -> None:
    tls = ServerTLS(pki.server_cert.read_bytes(), pki.server_key.read_bytes(), client_ca=pki.ca.read_bytes())
    with router_server(tls_workers, tls, **upstream(pki)) as address:
        with Client(address, timeout_s=10, tls=ClientTLS.from_files(pki.ca, pki.client_cert, pki.client_key)) as c:
            assert c.models()
        with Client(address, timeout_s=10, tls=ClientTLS.from_files(pki.ca)) as c, pytest.raises(UnavailableError):
            c.models()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "SPECROUTER_TOKEN"}
    return subprocess.run([sys.executable, "-m", "specrouter.cli", *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, env={**base, **(env or {})})


def test_the_command_line_over_tls_with_a_token(pki, tls_router, plain_tokens, tmp_path) -> None:
    generate = ["generate", PROMPT, "--router", tls_router, "--tls-ca", str(pki.ca), "--json",
                "--max-new-tokens", str(REQUEST["max_new_tokens"]), "--chain", REQUEST["chain"], "--window", "4"]
    done = _cli(*generate, env={"SPECROUTER_TOKEN": TOKEN})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["token_ids"] == plain_tokens
    path = tmp_path / "token"
    path.write_text(TOKEN)
    done = _cli("models", "--router", tls_router, "--tls-ca", str(pki.ca), "--token-file", str(path), "--json")
    assert done.returncode == 0 and {m["name"] for m in json.loads(done.stdout)} == {DRAFTER, TARGET, "lookup"}
    refused = _cli("models", "--router", tls_router, "--tls-ca", str(pki.ca))
    assert refused.returncode == 1 and "error: UNAUTHENTICATED: this router requires a bearer token" in refused.stderr
    healthy = _cli("healthcheck", tls_router, "--tls-ca", str(pki.ca))
    assert healthy.returncode == 0, healthy.stderr


def test_a_router_process_takes_its_token_from_the_environment(pki, tls_workers, tmp_path, plain_tokens) -> None:
    """`python -m specrouter.router` with TLS both ways: the token is in its environment, never its
    command line, which every user of the machine can read."""
    args = ["--workers", ",".join(tls_workers), "--tokenizer-dir", str(DEMO_POOL / TARGET), "--target", TARGET,
            "--port", "0", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
            "--upstream-ca", str(pki.ca), "--upstream-cert", str(pki.client_cert),
            "--upstream-key", str(pki.client_key)]
    proc = ServiceProcess("specrouter.router", *args, log_dir=tmp_path, env={"SPECROUTER_ROUTER_AUTH_TOKEN": TOKEN})
    try:
        argv = Path(f"/proc/{proc.proc.pid}/cmdline").read_bytes().decode().split("\0")
        assert "--upstream-ca" in argv and not any(TOKEN in a for a in argv)
        tls = ClientTLS.from_files(pki.ca)
        with Client(proc.address, timeout_s=60, tls=tls, token=TOKEN) as client:
            assert client.generate(PROMPT, **REQUEST).token_ids == plain_tokens
        with Client(proc.address, timeout_s=10, tls=tls, token="") as client, pytest.raises(UnauthenticatedError):
            client.models()
    finally:
        proc.stop()
