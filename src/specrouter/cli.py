"""The `specrouter` command line."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


@app.callback()
def _root() -> None:
    """SpecRouter: lossless, adaptive, multi-level speculative decoding."""


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command("train-pool")
def train_pool(
    out: Path = typer.Option(Path("models/demo-pool"), help="Where the pool is written."),
    work: Path = typer.Option(Path(".cache/train-pool"), help="Tokenizer and token streams, reused on resume."),
    seed: int = typer.Option(1234),
    target_steps: int = typer.Option(800),
    mid_steps: int = typer.Option(600),
    drafter_steps: int = typer.Option(700),
    threads: int = typer.Option(0, help="Torch CPU threads (0: torch's default)."),
    bf16: bool = typer.Option(True, help="bf16 autocast for training (master weights stay fp32)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Train the demo pool (tokenizer, target, distilled drafters) and write its model cards."""
    _logging(verbose)
    import torch

    from specrouter.pool.build import BuildPlan, build_pool
    from specrouter.progress import progress_bar

    if threads:
        torch.set_num_threads(threads)
    plan = BuildPlan(seed=seed, target_steps=target_steps, mid_steps=mid_steps,
                     drafter_steps=drafter_steps, bf16=bf16)
    build_pool(out, work, plan, progress_bar)


def main() -> None:
    app()
