"""TLS and token settings: what each service refuses at start, and how it says so. No server runs here
but the services' own start-up, which stops before anything loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from specrouter.profiler.settings import ProfilerSettings
from specrouter.router.auth import bearer_token, load_token
from specrouter.router.settings import RouterSettings
from specrouter.tls import ClientTLS, CredentialsError, server_tls
from specrouter.worker.settings import WorkerSettings
from tests.security.conftest import TOKEN

START_TIMEOUT_S = 120


def worker_settings(**tls) -> WorkerSettings:
    return WorkerSettings(model_dir=Path("unused"), **tls)


def router_settings(**fields) -> RouterSettings:
    return RouterSettings(workers=["127.0.0.1:1"], tokenizer_dir=Path("unused"), **fields)


def test_no_tls_settings_is_plaintext() -> None:
    assert server_tls(worker_settings(), mutual_only=True) is None
    assert server_tls(router_settings()) is None


def test_a_missing_file_is_named_with_its_flag_and_variable(pki, tmp_path) -> None:
    missing = tmp_path / "nowhere" / "server.pem"
    with pytest.raises(CredentialsError) as err:
        server_tls(worker_settings(tls_cert=missing, tls_key=pki.server_key, tls_client_ca=pki.ca), mutual_only=True)
    assert str(missing) in str(err.value) and "--tls-cert or SPECROUTER_WORKER_TLS_CERT" in str(err.value)
    with pytest.raises(CredentialsError, match="--tls-client-ca or SPECROUTER_PROFILER_TLS_CLIENT_CA"):
        server_tls(ProfilerSettings(tls_cert=pki.server_cert, tls_key=pki.server_key, tls_client_ca=missing),
                   mutual_only=True)


def test_a_file_that_is_not_pem_is_refused(pki, tmp_path) -> None:
    garbage = tmp_path / "key.txt"
    garbage.write_text("not a key\n")
    with pytest.raises(CredentialsError, match=r"key\.txt, given by --tls-key or SPECROUTER_ROUTER_TLS_KEY, is not"):
        server_tls(router_settings(tls_cert=pki.server_cert, tls_key=garbage))


def test_settings_that_do_not_go_together(pki) -> None:
    with pytest.raises(CredentialsError, match="set --tls-key"):
        server_tls(router_settings(tls_cert=pki.server_cert))
    with pytest.raises(CredentialsError, match="set --tls-cert"):
        server_tls(router_settings(tls_key=pki.server_key))
    with pytest.raises(CredentialsError, match="SPECROUTER_ROUTER_TLS_CLIENT_CA is set but TLS is off"):
        server_tls(router_settings(tls_client_ca=pki.ca))
    with pytest.raises(CredentialsError, match="a client certificate needs its key"):
        ClientTLS.from_files(pki.ca, cert=pki.client_cert)


def test_workers_and_the_profiler_take_only_mutual_tls(pki) -> None:
    """TLS without a client CA is refused where only routers may call; the router's public side takes it."""
    one_way = dict(tls_cert=pki.server_cert, tls_key=pki.server_key)
    with pytest.raises(CredentialsError, match="only mutual TLS.*--tls-client-ca or SPECROUTER_WORKER_TLS_CLIENT_CA"):
        server_tls(worker_settings(**one_way), mutual_only=True)
    with pytest.raises(CredentialsError, match="only mutual TLS"):
        server_tls(ProfilerSettings(**one_way), mutual_only=True)
    assert not server_tls(router_settings(**one_way)).mutual
    assert server_tls(worker_settings(**one_way, tls_client_ca=pki.ca), mutual_only=True).mutual


def _run(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=START_TIMEOUT_S, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("module,args", [
    ("specrouter.worker", ["--model-dir", "unused"]),
    ("specrouter.profiler", ["--port", "0"]),
    ("specrouter.router", ["--workers", "127.0.0.1:1", "--tokenizer-dir", "unused"]),
], ids=["worker", "profiler", "router"])
def test_a_service_with_a_missing_file_stops_at_start(pki, tmp_path, module, args) -> None:
    """Before it loads a model or binds a port: a non-zero exit and one line naming the file and the flag."""
    missing = tmp_path / "missing-key.pem"
    done = _run(module, *args, "--tls-cert", str(pki.server_cert), "--tls-key", str(missing),
                "--tls-client-ca", str(pki.ca))
    assert done.returncode != 0
    assert f"cannot read {missing}, given by --tls-key" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "listening" not in done.stdout


def test_the_token_is_never_a_flag() -> None:
    """`--auth-token VALUE` is refused without echoing the value; the variable and the file are the ways."""
    for flag in (["--auth-token", TOKEN], [f"--auth-token={TOKEN}"]):
        done = _run("specrouter.router", "--workers", "127.0.0.1:1", "--tokenizer-dir", "unused", *flag)
        assert done.returncode == 2
        assert "SPECROUTER_ROUTER_AUTH_TOKEN or --auth-token-file" in done.stderr, done.stderr
        assert TOKEN not in done.stderr + done.stdout


def test_the_token_comes_from_the_variable_or_a_file(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SPECROUTER_ROUTER_AUTH_TOKEN", raising=False)
    assert load_token(router_settings()) is None
    monkeypatch.setenv("SPECROUTER_ROUTER_AUTH_TOKEN", TOKEN)
    assert load_token(router_settings()) == TOKEN
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    with pytest.raises(ValidationError, match="given twice"):
        router_settings(auth_token_file=path)
    monkeypatch.delenv("SPECROUTER_ROUTER_AUTH_TOKEN")
    assert load_token(router_settings(auth_token_file=path)) == TOKEN
    assert TOKEN not in repr(router_settings(auth_token=SecretStr(TOKEN)))   # never in a log line of the settings
    path.write_text("\n")
    with pytest.raises(CredentialsError, match=f"the token file {path}, given by --auth-token-file .* is empty"):
        load_token(router_settings(auth_token_file=path))
    with pytest.raises(CredentialsError, match="cannot read the token file"):
        load_token(router_settings(auth_token_file=tmp_path / "absent"))


def test_bearer_metadata_is_read_as_sent() -> None:
    assert bearer_token((("authorization", f"Bearer {TOKEN}"),)) == TOKEN
    assert bearer_token((("x-other", "1"), ("authorization", f"bearer  {TOKEN} "))) == TOKEN
    assert bearer_token((("authorization", TOKEN),)) is None              # no scheme
    assert bearer_token((("authorization", f"Basic {TOKEN}"),)) is None   # another scheme
    assert bearer_token((("authorization", "Bearer "),)) is None
    assert bearer_token(None) is None
