"""TLS for SpecRouter's channels: a server's credentials from its settings, a client's from PEM files.

Every server takes `tls_cert` and `tls_key` (its certificate chain and private key) and, for mutual TLS,
`tls_client_ca`: the CA whose certificates its clients must present, verified before any call runs.
Workers and the profiler hear only from routers, so with TLS on they take mutual TLS alone: a client
without a certificate from that CA cannot call them. The router's public side may also run without it
(clients prove who they are with a bearer token, `auth.py`). A server with none of the three set
listens in plaintext, as before.

The PEM files are read once, when a service starts; a file that is missing or unreadable stops it with
a message that names the file and the setting (flag and environment variable) that gave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
from pydantic_settings import BaseSettings

PEM_MARK = b"-----BEGIN "


class CredentialsError(ValueError):
    """TLS or token settings that cannot be used: a file missing, unreadable or empty, or settings that do
    not go together."""


def setting_hint(settings_type: type[BaseSettings], name: str) -> str:
    """How an operator sets `name` of a service: `--tls-cert or SPECROUTER_WORKER_TLS_CERT`."""
    prefix = settings_type.model_config.get("env_prefix", "")
    return f"--{name.replace('_', '-')} or {prefix}{name.upper()}"


def read_pem(path: str | Path, given_by: str) -> bytes:
    """The bytes of a PEM file; `given_by` names the setting that pointed at it, for the error."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CredentialsError(f"cannot read {path}, given by {given_by}: {exc.strerror or exc}") from None
    if PEM_MARK not in data:
        raise CredentialsError(f"{path}, given by {given_by}, is not a PEM file (no '-----BEGIN' line)")
    return data


@dataclass(frozen=True)
class ServerTLS:
    """A server's certificate chain and key, and the CA its clients' certificates must chain to (None:
    clients present none)."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)], root_certificates=self.client_ca,
                                           require_client_auth=self.mutual)


def server_tls(settings: BaseSettings, mutual_only: bool = False) -> ServerTLS | None:
    """The TLS of a server from its `tls_cert`, `tls_key` and `tls_client_ca` settings; None for plaintext.
    `mutual_only`: with TLS on, a client CA is required (workers and the profiler)."""
    hint = lambda name: setting_hint(type(settings), name)  # noqa: E731
    cert, key, client_ca = settings.tls_cert, settings.tls_key, settings.tls_client_ca
    if cert is None and key is None:
        if client_ca is not None:
            raise CredentialsError(f"{hint('tls_client_ca')} is set but TLS is off; set "
                                 f"{hint('tls_cert')} and {hint('tls_key')} too")
        return None
    if cert is None or key is None:
        missing = "tls_cert" if cert is None else "tls_key"
        raise CredentialsError(f"TLS needs both a certificate and its key; set {hint(missing)}")
    if mutual_only and client_ca is None:
        raise CredentialsError("with TLS on, only mutual TLS is accepted (clients present a certificate, "
                             f"as the router does); set {hint('tls_client_ca')} to the CA that signs it")
    return ServerTLS(read_pem(cert, hint("tls_cert")), read_pem(key, hint("tls_key")),
                     None if client_ca is None else read_pem(client_ca, hint("tls_client_ca")))


@dataclass(frozen=True)
class ClientTLS:
    """What a client needs for TLS: the CA that signs the server's certificate (None: the system's roots)
    and, for mutual TLS, its own certificate chain and key."""

    ca: bytes | None = None
    cert_chain: bytes | None = None
    private_key: bytes | None = None

    @classmethod
    def from_files(cls, ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None,
                   names: tuple[str, str, str] = ("ca", "cert", "key")) -> ClientTLS:
        """Reads the PEM files; `names` are the settings that gave them (ca, cert, key), for errors."""
        if (cert is None) != (key is None):
            given, missing = (names[1], names[2]) if key is None else (names[2], names[1])
            raise CredentialsError(f"a client certificate needs its key and the key its certificate: {given} is "
                                 f"set, {missing} is not")
        return cls(None if ca is None else read_pem(ca, names[0]), None if cert is None else read_pem(cert, names[1]),
                   None if key is None else read_pem(key, names[2]))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.private_key,
                                            certificate_chain=self.cert_chain)


def channel(address: str, tls: ClientTLS | None = None, options=()) -> grpc.Channel:
    """A channel to `address`: over TLS with `tls`, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options)


def aio_channel(address: str, tls: ClientTLS | None = None, options=()) -> grpc.aio.Channel:
    """`channel` for asyncio."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.credentials(), options=options)

