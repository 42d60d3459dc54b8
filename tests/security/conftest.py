"""Fixtures of the security tests: certificates made here, and servers in this process on port 0.

The pool is the demo pool's two smallest models (stdlib-1m drafts for stdlib-5m, the target), each loaded
twice: once behind mutual-TLS worker servers, once behind plaintext ones, so that a TLS router and a
plaintext router never share a worker's states."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest

from specrouter.router.auth import upstream_tls
from specrouter.router.settings import RouterSettings
from specrouter.tls import ClientTLS, ServerTLS, server_tls
from specrouter.worker.settings import WorkerSettings
from tests.conftest import DEMO_POOL
from tests.security.pki import PKI, make_pki

DRAFTER, TARGET = "stdlib-1m", "stdlib-5m"
TOKEN = "s3cret-token-for-tests"
PROMPT = "def fibonacci(n):"
REQUEST = dict(max_new_tokens=16, chain=f"{DRAFTER},{TARGET}", window=4)   # greedy: temperature 0


@pytest.fixture(scope="package")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


def mutual_tls(pki: PKI) -> ServerTLS:
    """What a worker or the profiler serves with: the server certificate, clients signed by the test CA."""
    settings = WorkerSettings(model_dir=Path("unused"), tls_cert=pki.server_cert, tls_key=pki.server_key,
                              tls_client_ca=pki.ca)
    return server_tls(settings, mutual_only=True)


def router_client_tls(pki: PKI) -> ClientTLS:
    """The router's side of mutual TLS: the test CA and the router's client certificate."""
    return ClientTLS.from_files(pki.ca, pki.client_cert, pki.client_key)


def _worker_servers(tls: ServerTLS | None) -> Iterator[list[str]]:
    from specrouter.worker import server as srv
    from specrouter.worker.compute import ComputeLoop

    servers, addresses = [], []
    try:
        for model in (DRAFTER, TARGET):
            settings = WorkerSettings(model_dir=DEMO_POOL / model, threads=4)
            engine, info = srv.build_engine(settings)
            srv.warm_up(engine, info)
            server, port, health = srv.create_server(settings, engine, info, ComputeLoop(), tls)
            server.start()
            srv.mark_serving(health, True)
            servers.append(server)
            addresses.append(f"127.0.0.1:{port}")
        yield addresses
    finally:
        for server in servers:
            server.stop(0)


@pytest.fixture(scope="package")
def tls_workers(pki) -> Iterator[list[str]]:
    """Addresses of the mutual-TLS workers (drafter, target)."""
    yield from _worker_servers(mutual_tls(pki))


@pytest.fixture(scope="package")
def plain_workers() -> Iterator[list[str]]:
    """Addresses of the plaintext workers (drafter, target)."""
    yield from _worker_servers(None)


@contextmanager
def router_server(workers: list[str], tls: ServerTLS | None = None, token: str | None = None,
                  **settings) -> Iterator[str]:
    """A router in this process over `workers`; `settings` are RouterSettings fields (upstream_* among
    them); yields its address."""
    from specrouter.router import server as srv

    config = RouterSettings(workers=workers, tokenizer_dir=DEMO_POOL / TARGET, target=TARGET, host="127.0.0.1",
                            port=0, max_in_flight=4, max_queued=4, worker_timeout_s=10, **settings)
    upstream = upstream_tls(config)
    router = srv.Router(config, srv.connect_workers(config, upstream), upstream)
    router.start()
    server, port, _ = srv.create_server(config, router, tls, token)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)
        router.close()   # and its channels to the workers


def rpc_code(call) -> grpc.StatusCode:
    """The status a call ends with."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="package")
def plain_tokens(plain_workers) -> list[int]:
    """The greedy tokens of PROMPT through a plaintext router over plaintext workers: what TLS must not change."""
    from specrouter import Client

    with router_server(plain_workers) as address, Client(address, timeout_s=60) as client:
        return client.generate(PROMPT, **REQUEST).token_ids
