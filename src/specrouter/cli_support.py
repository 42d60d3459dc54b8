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
