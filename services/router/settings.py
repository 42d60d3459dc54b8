"""The router's settings: one object, built in `main` from flags and `SPECROUTER_ROUTER_*` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from specrouter.router.scheduling.settings import SchedulerSettings


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECROUTER_ROUTER_", env_nested_delimiter="__")

    workers: list[str]                  # worker addresses, HOST:PORT, one per pool model
    tokenizer_dir: Path                 # the target's tokenizer (a checkpoint directory)
    profiler: str = ""                  # profiler address; empty: no measurements are reported
    snapshot_refresh_s: float = 1.0     # how often the profiler's metrics are fetched for decisions
    target: str = ""                    # the target's name; empty: the largest model
    pool_dir: Path | None = None        # the pool directory, for its offline pair similarities (the prior)
    default_chain: str = ""             # chain of requests that name none, with `adaptive = false`
    default_window: int = 4             # draft window of those requests
    adaptive: bool = True               # "auto" requests are scheduled; false: the default chain and window
    # the scheduler's knobs: --scheduler '{"hysteresis": 0.05}' or SPECROUTER_ROUTER_SCHEDULER__HYSTERESIS=0.05
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    default_max_new_tokens: int = 64
    host: str = "127.0.0.1"
    port: int = 0                       # 0 picks a free port
    worker_timeout_s: float = 60.0      # per worker RPC; also how long start-up waits for workers
    threads: int = 64                   # concurrent client calls
    grace_s: float = 10.0
