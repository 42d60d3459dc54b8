"""The router's settings: one object, built in `main` from flags and `SPECROUTER_ROUTER_*` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECROUTER_ROUTER_")

    workers: list[str]                  # worker addresses, HOST:PORT, one per pool model
    tokenizer_dir: Path                 # the target's tokenizer (a checkpoint directory)
    profiler: str = ""                  # profiler address; empty: no measurements are reported
    snapshot_refresh_s: float = 1.0     # how often the profiler's metrics are fetched for decisions
    target: str = ""                    # the target's name; empty: the largest model
    default_chain: str = ""             # chain for "auto" until the scheduler decides; empty: smallest + target
    default_window: int = 4             # draft window when the request gives none
    default_max_new_tokens: int = 64
    host: str = "127.0.0.1"
    port: int = 0                       # 0 picks a free port
    worker_timeout_s: float = 60.0      # per worker RPC; also how long start-up waits for workers
    threads: int = 64                   # concurrent client calls
    grace_s: float = 10.0
