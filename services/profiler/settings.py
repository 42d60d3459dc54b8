"""The profiler's settings: one typed object, built in `main` from SPECROUTER_PROFILER_* variables and flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProfilerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECROUTER_PROFILER_", frozen=True)

    # e.g. redis://redis:6379/0. None keeps the metrics in this process: the local embedded default,
    # right only while a single profiler serves every router.
    redis_url: str | None = None
    host: str = "[::]"
    port: int = Field(50053, ge=0, le=65535, description="0 picks a free port")
    # The weight of the newest report in the forward latency and similarity EMAs. 0.1 gives a memory of
    # about 1 / alpha = 10 reports per key (half-life ln 2 / alpha, about 7): enough to smooth the noise
    # of single forward passes, short enough to follow a change of load within a few dozen steps.
    # The memory counts reports, not seconds: the more routers report to a key, the faster it turns over.
    ema_alpha: float = Field(0.1, gt=0.0, le=1.0)
    # The weight of the newest check in the acceptance EMAs (metrics.py): 0.01 remembers about 200
    # checks per position, a rate within about 0.03 of its mean; 12 cycles at batch 16, 200 (a dozen
    # 48-token requests) at batch 1, where a batch's own record (the scheduler's batch shift) follows
    # a change of prompts sooner.
    acceptance_alpha: float = Field(0.01, gt=0.0, le=1.0)
    # Prefix of the Redis keys; profilers sharing a prefix share their metrics (and must share both alphas).
    key_prefix: str = Field("specrouter:profiler", min_length=1)
    redis_timeout_s: float = Field(0.5, gt=0.0, description="connect and read timeout of one Redis call")
    # After the store failed, calls within this many seconds skip it (stale snapshot, dropped report) so
    # that an unreachable Redis does not hold every handler for a timeout.
    store_retry_s: float = Field(1.0, ge=0.0)
    max_workers: int = Field(8, ge=1, description="threads serving calls")
    grace_s: float = Field(5.0, ge=0.0, description="time calls in flight get to finish on shutdown")
    # TLS (specrouter/tls.py): the profiler's certificate chain and key, and the CA of its clients' (the
    # routers') certificates; with TLS on, only clients with such a certificate get in (mutual TLS)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    metrics_port: int = Field(0, ge=-1, le=65535, description="Prometheus /metrics over HTTP on `host`; 0 picks "
                              "a free port, -1 serves none")
