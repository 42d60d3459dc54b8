"""The gateway's settings: one object, built in `main` from flags and `SPECROUTER_GATEWAY_*` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "SPECROUTER_GATEWAY_"


def setting_hint(name: str) -> str:
    """How an operator changes the setting `name`: its flag or its environment variable."""
    return f"--{name.replace('_', '-')} or {ENV_PREFIX}{name.upper()}"


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True)

    # the router (or routers: dns:///HOST:PORT spreads the calls over every address the name resolves to)
    router: str = "127.0.0.1:50051"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)   # 0 picks a free port
    # The target's checkpoint directory: its chat template (tokenizer_config.json's `chat_template`, or
    # chat_template.jinja) formats chat messages. Without one, /v1/chat/completions answers 400.
    tokenizer_dir: Path | None = None
    chat_template: Path | None = None         # a Jinja chat template file, used in place of the tokenizer's
    # other names clients may give as `model` for the target (tools that insist on a name of their own)
    model_aliases: list[str] = Field(default_factory=list)
    request_timeout_s: float = Field(300.0, gt=0)   # each router call's deadline; past it: 504
    max_body_bytes: int = Field(4 << 20, ge=1024)   # a request body beyond this is refused with 413
    max_choices: int = Field(64, ge=1)              # the most choices one request may ask for (`n` times its prompts)
    models_refresh_s: float = Field(30.0, ge=0)     # how long the router's list of models is reused
    grace_s: float = Field(10.0, ge=0)              # time requests in flight get to finish on shutdown
    metrics_port: int = Field(0, ge=-1, le=65535)   # Prometheus /metrics on `host`; 0 picks a free port, -1: none
    # HTTPS: the gateway's certificate chain and key (PEM); without them it serves plain HTTP
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # TLS to the router: the CA that signs its certificate (and a client certificate and key, where the
    # router asks for one). Callers' bearer tokens are passed on to the router as they come.
    router_ca: Path | None = None
    router_cert: Path | None = None
    router_key: Path | None = None
