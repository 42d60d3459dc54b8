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


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def default_pool() -> Path:
    """The demo pool shipped in the repository (`models/demo-pool`)."""
    return Path(__file__).resolve().parents[2] / "models" / "demo-pool"


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="Text to continue."),
    pool: Path = typer.Option(None, help="Pool directory (default: the shipped demo pool)."),
    max_new_tokens: int = typer.Option(64, min=1),
    temperature: float = typer.Option(0.0, min=0.0, help="0 is greedy."),
    top_p: float = typer.Option(1.0),
    top_k: int = typer.Option(0, min=0),
    repetition_penalty: float = typer.Option(1.0),
    seed: int = typer.Option(0),
    chain: str = typer.Option("", help="'target' for target-only, or NAME,NAME,... ending at the target "
                                       "(default: the smallest model, then the target)."),
    window: int = typer.Option(4, min=1, max=16, help="Draft window W."),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Generate a continuation of PROMPT with the pool running in this process."""
    import json
    import sys

    from specrouter.pool.load import PoolDir, parse_dtype
    from specrouter.pool.manifest import PoolError
    from specrouter.router.inprocess import InProcessPool, chain_name, parse_chain
    from specrouter.worker.sampling import SamplingParams

    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                            repetition_penalty=repetition_penalty, seed=seed)
    try:
        params.validate()
        pool_dir = PoolDir.open(pool or default_pool())
        steps = parse_chain(chain, pool_dir.names, pool_dir.target) if chain else None
        _quiet_transformers()
        local = InProcessPool(pool_dir, dtype=parse_dtype(dtype), device=device)
        steps = steps or (local.by_size()[0], local.target)
    except (ValueError, PoolError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    result = local.generate([prompt], steps, window, params, max_new_tokens)[0]
    if as_json:
        print(json.dumps({
            "text": result.text, "token_ids": result.token_ids, "finish_reason": result.finish_reason,
            "cycles": result.cycles, "chain_counts": dict(result.chain_counts),
            "accepted_per_level": result.accepted_per_level, "seconds": round(result.seconds, 4),
        }))
        return
    sys.stdout.write(prompt + result.text + "\n")
    tokens = len(result.token_ids)
    typer.echo(f"[{tokens} tokens in {result.seconds:.2f} s ({tokens / max(result.seconds, 1e-9):.1f} tok/s), "
               f"{result.cycles} cycles, chain {chain_name(steps)}, window {window}, finish {result.finish_reason}]",
               err=True)


def main() -> None:
    app()
