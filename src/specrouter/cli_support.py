"""What the `specrouter` commands share: logging, the shipped demo pool, the default router address, and
errors as one line and exit code 1."""

from __future__ import annotations

import logging
from pathlib import Path

import typer


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def default_pool() -> Path:
    """The demo pool shipped in the repository (`models/demo-pool`)."""
    return Path(__file__).resolve().parents[2] / "models" / "demo-pool"


DEFAULT_ROUTER = "127.0.0.1:50051"


def fail(code: str, message: str) -> None:
    typer.echo(f"error: {code}: {message}", err=True)
    raise typer.Exit(1)


# The options of the commands that call a server: TLS files, and the router's bearer token from a file (or
# SPECROUTER_TOKEN), never from a flag's value, which the process list shows to every user of the machine.
TLS_CA = typer.Option(None, "--tls-ca", help="CA certificate (PEM) that signs the server's: connect over TLS.")
TLS_CERT = typer.Option(None, "--tls-cert", help="Client certificate (PEM), for a server that wants mutual TLS.")
TLS_KEY = typer.Option(None, "--tls-key", help="The private key (PEM) of --tls-cert.")
TOKEN_FILE = typer.Option(None, "--token-file", help="File holding the router's bearer token (default: the "
                          "SPECROUTER_TOKEN environment variable).")


def client_tls(ca: Path | None, cert: Path | None, key: Path | None):
    """The TLS the options ask for (any of them set: TLS), or None; an unreadable file ends the command."""
    from specrouter.tls import ClientTLS, CredentialsError

    if ca is None and cert is None and key is None:
        return None
    try:
        return ClientTLS.from_files(ca, cert, key, names=("--tls-ca", "--tls-cert", "--tls-key"))
    except CredentialsError as exc:
        fail("INVALID_ARGUMENT", str(exc))


def router_client(router: str, timeout_s: float | None, ca: Path | None, cert: Path | None, key: Path | None,
                  token_file: Path | None):
    """A `Client` for `router` with the TLS and token the options give; unreadable files end the command."""
    from specrouter.client import Client
    from specrouter.tls import CredentialsError

    tls = client_tls(ca, cert, key)
    try:
        return Client(router, timeout_s, tls=tls, token_file=token_file)
    except CredentialsError as exc:
        fail("INVALID_ARGUMENT", str(exc))
