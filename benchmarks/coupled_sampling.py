"""Coupled against standard speculative sampling: acceptance per level and tokens per second.

    python -m benchmarks.coupled_sampling [--pool DIR] [--prompts 8] [--new-tokens 64] [--rounds 3]
                                          [--temperatures 0.7,1.0] [--json FILE]

Standard speculative sampling accepts a token drawn from q with probability min(1, p/q), 1 - TV(p, q) on
average, and hands each level's rows up the chain; coupled sampling (sampling.py) accepts it iff the level's
own Gumbel-max pick is the same token, at least (1 - TV) / (1 + TV), and hands up no rows. Both run here on
the same held-out prompts, the same chains and windows, in process (the engines of the pool, as the router's
chain step drives them) and through a local cluster's services (a seeded request samples coupled, an
unseeded one standard), in interleaved rounds; the medians are printed with the machine line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from specrouter.inprocess import InProcessPool, chain_name
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.report.machine import machine_line
from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.contract.calls import SamplingParams

DEFAULT_POOL = Path(__file__).resolve().parents[1] / "models" / "demo-pool"
MODES = ("standard", "coupled")


def chains_of(pool: InProcessPool) -> list[tuple[tuple[str, ...], int]]:
    small, mid, target = pool.by_size()
    return [((small, target), 4), ((mid, target), 3), ((small, mid, target), 4)]


def in_process(pool, prompts, chain, window, params: SamplingParams, new_tokens: int) -> dict:
    """One prompt at a time (batch 1): seconds, tokens, and per level the tokens accepted over those tested
    (a level tests a proposal up to its first rejection)."""
    reports: list[CycleReport] = []
    seconds = tokens = 0.0
    for i, p in enumerate(prompts):
        batch = ChainBatch(pool.engines, pool.target, pool.context_length)
        batch.add([Row(f"r{i}", list(p), len(p), dataclasses.replace(params, seed=1000 + i), new_tokens)])
        start = time.perf_counter()
        done = run_to_completion(batch, lambda _: (chain, window), reports.append)
        seconds += time.perf_counter() - start
        tokens += len(done[f"r{i}"].generated)
    acceptance = {}
    for level in chain[1:]:
        accepted = [a for r in reports for a in r.accepted[level]]
        proposed = [n for r in reports for n in r.proposed[level]]
        tested = sum(min(a + 1, n) for a, n in zip(accepted, proposed))
        acceptance[level] = sum(accepted) / max(tested, 1)
    return {"seconds": seconds, "tokens": tokens, "acceptance": acceptance}


def through_services(client, texts, chain, window, temperature: float, coupled: bool, new_tokens: int) -> dict:
    seconds = tokens = 0.0
    for i, text in enumerate(texts):
        start = time.perf_counter()
        r = client.generate(text, max_new_tokens=new_tokens, temperature=temperature, chain=",".join(chain),
                            window=window, seed=1000 + i if coupled else None)
        seconds += time.perf_counter() - start
        tokens += len(r.token_ids)
    return {"seconds": seconds, "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--no-services", action="store_true", help="Measure in process only.")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()

    from specrouter.client import Client
    from specrouter.launcher import LocalCluster

    pool = InProcessPool.open(args.pool)
    texts = heldout_code_prompts(args.prompts)
    prompts = [pool.encode(t) for t in texts]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    print(machine_line())
    print(f"pool {args.pool.name}: {len(prompts)} held-out prompts x {args.new_tokens} tokens, batch 1, "
          f"{args.rounds} interleaved rounds, medians", flush=True)
    cluster = None if args.no_services else LocalCluster(args.pool, Path(tempfile.mkdtemp(prefix="coupled-")))
    client = None if cluster is None else Client(cluster.router.address, timeout_s=600)
    cells = [(t, c, w, m) for t in temperatures for c, w in chains_of(pool) for m in MODES]
    runs: dict[tuple, list[dict]] = {cell: [] for cell in cells}
    try:
        for rnd in range(args.rounds):
            for cell in cells:
                temperature, chain, window, mode = cell
                params = SamplingParams(temperature=temperature, coupled=mode == "coupled")
                run = in_process(pool, prompts, chain, window, params, args.new_tokens)
                if client is not None:
                    run["services"] = through_services(client, texts, chain, window, temperature,
                                                       mode == "coupled", args.new_tokens)
                runs[cell].append(run)
                print(f"  round {rnd + 1}/{args.rounds} T={temperature} {chain_name(chain)} W={window} {mode}: "
                      f"{run['tokens'] / run['seconds']:.1f} tok/s in process", file=sys.stderr, flush=True)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop()
    rows = []
    for cell in cells:
        temperature, chain, window, mode = cell
        rs = runs[cell]
        row = {"temperature": temperature, "chain": chain_name(chain), "window": window, "mode": mode,
               "acceptance": {lv: statistics.median(r["acceptance"][lv] for r in rs) for lv in chain[1:]},
               "tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in rs)}
        if client is not None:
            row["services_tokens_per_s"] = statistics.median(r["services"]["tokens"] / r["services"]["seconds"]
                                                             for r in rs)
        rows.append(row)
    print(f"\n{'T':>4} {'chain':<34} {'W':>2} {'mode':<9} {'acceptance per level':<34} {'in process':>11} "
          f"{'services':>9}")
    for r in rows:
        acc = ", ".join(f"{lv.split('-')[-1]} {a:.3f}" for lv, a in r["acceptance"].items())
        svc = f"{r['services_tokens_per_s']:9.1f}" if "services_tokens_per_s" in r else f"{'-':>9}"
        print(f"{r['temperature']:4.1f} {r['chain']:<34} {r['window']:>2} {r['mode']:<9} {acc:<34} "
              f"{r['tokens_per_s']:11.1f} {svc}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
