"""The worker's settings: one object, built in `main` from flags and `SPECROUTER_WORKER_*` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECROUTER_WORKER_")

    model_dir: Path                     # a Hugging Face checkpoint with its tokenizer
    name: str = ""                      # the model's name in the pool (default: the directory's name)
    dtype: str = "float32"              # float32, float16 or bfloat16
    device: str = "cpu"                 # cpu, cuda, cuda:1, ...
    host: str = "127.0.0.1"             # "[::]" or "0.0.0.0" in a container
    port: int = 0                       # 0 picks a free port
    state_ttl_s: float = 600.0          # states untouched this long are reclaimed
    compact_hole_fraction: float = 0.5  # compact a state when this fraction of its entries are holes
    draft_lookahead: int = 4            # guesses a drafter drafting for one row feeds per pass (0: none)
    prepack_weights: bool = True        # large projections prepacked for oneDNN on the CPU (faster; logits
                                        # equal transformers' to rounding; false: bit for bit)
    max_batch_size: int = 64            # rows per state; sizes the message limits
    max_window: int = 16                # draft window; sizes the message limits
    threads: int = 16                   # gRPC handler threads (forward passes are serialised per model)
    torch_threads: int = 0              # PyTorch's intra-op threads on the CPU (0: PyTorch's default, one per core)
    grace_s: float = 10.0               # shutdown grace for in-flight calls
    # TLS (specrouter/tls.py): the worker's certificate chain and key, and the CA of its clients' (the
    # routers') certificates; with TLS on, only clients with such a certificate get in (mutual TLS)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # Warm-up latency profile, the scheduler's prior before live measurements: one forward per pair.
    profile_batch_sizes: list[int] = [1, 2, 4, 8, 16]
    profile_tokens_per_row: list[int] = [1, 2, 3, 4, 5, 7, 9]
    metrics_port: int = 0               # Prometheus /metrics over HTTP on `host`; 0 picks a free port, -1: none

    @property
    def model_name(self) -> str:
        return self.name or self.model_dir.name
