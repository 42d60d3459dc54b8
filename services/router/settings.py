"""The router's settings: one object, built in `main` from flags and `SPECROUTER_ROUTER_*` variables."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from specrouter.router.scheduling.settings import SchedulerSettings

ENV_PREFIX = "SPECROUTER_ROUTER_"
SPARE_THREADS = 16   # server threads beyond the requests in flight and waiting: models, schedules, health, refusals


def setting_hint(name: str) -> str:
    """How an operator changes the setting `name`: its flag or its environment variable."""
    return f"--{name.replace('_', '-')} or {ENV_PREFIX}{name.upper()}"


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__")

    # worker addresses, HOST:PORT or dns:///HOST:PORT: each stands for every address its host resolves to,
    # one replica each (a headless Service's name: its ready pods); every model of the pool, one or more times
    workers: list[str] = []
    # instead of workers: the pool's models (pool_dir) run in the router's own process, each level called
    # without an RPC; for one host whose models share its cores or its device (models_in_process.py)
    models_in_process: bool = False
    models_dtype: str = "float32"       # with models_in_process: float32, float16 or bfloat16
    models_device: str = "cpu"          # with models_in_process: cpu, cuda, cuda:1, ...
    workers_resolve_s: float = Field(5.0, gt=0)   # how often the names in `workers` are resolved again
    tokenizer_dir: Path                 # the target's tokenizer (a checkpoint directory)
    profiler: str = ""                  # profiler address; empty: no measurements are reported
    snapshot_refresh_s: float = 1.0     # how often the profiler's metrics are fetched for decisions
    target: str = ""                    # the target's name; empty: the largest model
    pool_dir: Path | None = None        # the pool directory, for its offline pair similarities (the prior)
    default_chain: str = ""             # chain of requests that name none, with `adaptive = false`
    default_window: int = 4             # draft window of those requests
    adaptive: bool = True               # "auto" requests are scheduled; false: the default chain and window
    # the drafter, a worker in another process, drafts the next window while the levels above verify this
    # one (docs/pipelined.md): "auto" where the router measures it faster than lock-step (it pays where each
    # worker has compute of its own), "always" in every cycle, "off" never (true and false mean auto and off)
    pipelined: Literal["off", "auto", "always"] = "off"
    # the scheduler's knobs: --scheduler '{"hysteresis": 0.05}' or SPECROUTER_ROUTER_SCHEDULER__HYSTERESIS=0.05
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    default_max_new_tokens: int = Field(64, ge=1)
    # a request with a seed samples coupled (its text depends on the prompt, the seed and the target alone,
    # whatever the chain); one without samples coupled too when this is on, else by speculative sampling
    couple_unseeded: bool = False
    lookup: bool = True   # named chains may start with the model-free lookup level ("lookup,29m")
    # tokens of earlier requests the lookup also copies from (0: each request's own only; a request that
    # repeats another's text then runs faster, which tenants who must not learn of each other's text may see)
    lookup_recent_tokens: int = Field(1 << 16, ge=0)
    # in a chain of three or more levels that starts with the lookup ("lookup,1m,29m"), a cycle where no row
    # has a match runs as the chain above the lookup, its next level drafting this many tokens (0: that level
    # hands up the one token it verifies past nothing)
    lookup_fallback_window: int = Field(3, ge=0)
    # a row joining an auto batch is prefilled at once on the models the batch ran within this many cycles
    # (and the target); the others prefill it when a chain through them next runs (0: every model at once)
    prefill_recent_cycles: int = Field(16, ge=0)
    # admission: a request over one of the first three is refused (INVALID_ARGUMENT); one that finds
    # max_in_flight requests generating waits in a line of max_queued, and beyond it is refused
    # (RESOURCE_EXHAUSTED). Unary calls and streams count alike.
    max_prompt_bytes: int = Field(1 << 20, ge=1)   # UTF-8 bytes of a prompt
    max_prompt_tokens: int = Field(0, ge=0)        # tokens of a prompt; 0: what the pool's context holds
    max_new_tokens: int = Field(0, ge=0)           # the most a request may ask for; 0: what the context leaves it
    max_in_flight: int = Field(64, ge=1)           # requests generating at once
    max_queued: int = Field(128, ge=0)             # requests waiting for one of those places
    host: str = "127.0.0.1"
    port: int = 0                       # 0 picks a free port
    worker_timeout_s: float = 60.0      # per worker RPC; also how long start-up waits for workers
    # while no replica of the target answers (a worker restarting), requests wait this long for one to come
    # back, then fail UNAVAILABLE; their own deadlines still apply (0: they fail at once)
    target_wait_s: float = Field(30.0, ge=0)
    threads: int = Field(0, ge=0)       # server threads; 0: max_in_flight + max_queued + SPARE_THREADS
    grace_s: float = 10.0
    metrics_port: int = Field(0, ge=-1)   # Prometheus /metrics over HTTP on `host`; 0 picks a free port, -1: none
    # TLS on the public API (specrouter/tls.py): the router's certificate chain and key; with a client CA
    # set, clients must present a certificate it signed (mutual TLS)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # TLS to the workers and the profiler: the CA that signs their certificates, and the router's own
    # client certificate and key, which they require once their TLS is on
    upstream_ca: Path | None = None
    upstream_cert: Path | None = None
    upstream_key: Path | None = None
    # A bearer token every RouterService call must carry (`authorization: Bearer <token>`; health and
    # reflection stay open). From a file, or from SPECROUTER_ROUTER_AUTH_TOKEN: never a flag, which
    # any user of the machine can read in the process list.
    auth_token_file: Path | None = None
    auth_token: SecretStr | None = None

    env_only: ClassVar[frozenset[str]] = frozenset({"auth_token"})   # fields with no flag

    @field_validator("pipelined", mode="before")
    @classmethod
    def _pipelined_mode(cls, value: object) -> object:
        text = str(value).strip().lower()
        return {"true": "auto", "1": "auto", "yes": "auto", "false": "off", "0": "off", "no": "off"}.get(text, text)

    @model_validator(mode="after")
    def _limits_agree(self) -> RouterSettings:
        if self.models_in_process and self.pool_dir is None:
            raise ValueError("models_in_process serves the models of pool_dir in the router itself: give "
                             f"{setting_hint('pool_dir')}, and no workers")
        if self.models_in_process and self.workers:
            raise ValueError("models_in_process serves the pool's models in the router itself; it takes no "
                             f"workers, got {self.workers}: drop {setting_hint('workers')} or models_in_process")
        if self.models_in_process and self.pipelined != "off":
            raise ValueError("pipelined runs the drafter beside the levels above it, on workers in other processes; "
                             "with models_in_process every level runs on the router's one compute thread, one after "
                             f"another: drop {setting_hint('pipelined')} or models_in_process")
        if not self.models_in_process and not [w for w in self.workers if w.strip()]:
            raise ValueError(f"no workers given: pass {setting_hint('workers')} (HOST:PORT,...), or "
                             f"{setting_hint('models_in_process')} with {setting_hint('pool_dir')} to serve the "
                             "pool's models in the router's own process")
        if self.max_new_tokens and self.default_max_new_tokens > self.max_new_tokens:
            raise ValueError(f"default_max_new_tokens ({self.default_max_new_tokens}) is over max_new_tokens "
                             f"({self.max_new_tokens}): requests that name none would be refused; lower the one "
                             "or raise the other")
        held = self.max_in_flight + self.max_queued
        if self.threads and self.threads <= held:
            raise ValueError(f"threads ({self.threads}) must exceed max_in_flight + max_queued ({held}): each "
                             "request generating or waiting holds a thread; raise threads, or set 0 to size it")
        if self.auth_token_file is not None and self.auth_token is not None:
            raise ValueError(f"a bearer token is given twice, by {setting_hint('auth_token_file')} and by "
                             f"{ENV_PREFIX}AUTH_TOKEN; keep one")
        return self

    def server_threads(self) -> int:
        return self.threads or self.max_in_flight + self.max_queued + SPARE_THREADS
