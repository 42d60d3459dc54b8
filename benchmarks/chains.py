"""Static chains in process: acceptance per ordered pair, tokens per target pass, speedup over target-only,
mask against compaction, and bytes per cycle of distribution rows.

    python -m benchmarks.chains [--pool DIR] [--prompts 8] [--new-tokens 64] [--windows 1,2,3,4,6]
                                [--batch-sizes 1,4] [--repeats 3] [--json FILE]

Every configuration runs the same prompts; configurations are interleaved and repeated so that drift
of a shared machine hits all of them alike; the median of the repeats is reported.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from specrouter.pool.prompts import heldout_code_prompts
from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.inprocess import InProcessPool, chain_name
from specrouter.worker import rows as wire
from specrouter.worker.engine import EngineSettings
from specrouter.contract.calls import SamplingParams

DEFAULT_POOL = Path(__file__).resolve().parents[1] / "models" / "demo-pool"
GREEDY = SamplingParams()


def run_batch(pool: InProcessPool, engines, target, prompts, chain, window, params, new_tokens,
              reports: list[CycleReport] | None = None) -> tuple[float, int]:
    """Generates for all prompts in batches; returns (seconds, tokens emitted)."""
    batch = ChainBatch(engines, target, pool.context_length)
    batch.add([Row(f"r{i}", list(p), len(p), replace(params, seed=i), new_tokens) for i, p in enumerate(prompts)])
    start = time.perf_counter()
    done = run_to_completion(batch, lambda _: (chain, window), reports.append if reports is not None else None)
    return time.perf_counter() - start, sum(len(r.generated) for r in done.values())


def generate_all(pool, prompts, chain, window, batch_size, new_tokens, params=GREEDY, reports=None,
                 engines=None, target=None):
    seconds = tokens = 0
    for i in range(0, len(prompts), batch_size):
        s, t = run_batch(pool, engines or pool.engines, target or pool.target, prompts[i : i + batch_size],
                         chain, window, params, new_tokens, reports)
        seconds, tokens = seconds + s, tokens + t
    return seconds, tokens


def pair_acceptance(pool: InProcessPool, prompts, new_tokens: int, window: int = 4) -> list[dict]:
    """Greedy acceptance of every ordered pair (drafter, verifier), the verifier acting as target."""
    out = []
    for drafter, verifier in itertools.permutations(pool.by_size(), 2):
        reports: list[CycleReport] = []
        engines = {drafter: pool.engines[drafter], verifier: pool.engines[verifier]}
        generate_all(pool, prompts, (drafter, verifier), window, 4, new_tokens, reports=reports,
                     engines=engines, target=verifier)
        accepted = [a for r in reports for a in r.accepted[verifier]]
        proposed = [p for r in reports for p in r.proposed[verifier]]
        # per-token acceptance: tokens accepted / tokens tested (testing stops at the first rejection)
        tested = sum(min(a + 1, p) for a, p in zip(accepted, proposed))
        out.append({"drafter": drafter, "verifier": verifier, "window": window,
                    "acceptance": sum(accepted) / max(tested, 1),
                    "mean_accepted": sum(accepted) / len(accepted)})
    return out


def chain_speedups(pool, prompts, windows, batch_sizes, new_tokens, repeats) -> list[dict]:
    others = [m for m in pool.by_size() if m != pool.target]
    chains = [(pool.target,)] + [(*s, pool.target) for n in range(1, len(others) + 1)
                                 for s in itertools.combinations(others, n)]
    configs = [(c, w, b) for b in batch_sizes for c in chains for w in ([1] if len(c) == 1 else windows)]
    times: dict[tuple, list[float]] = {cfg: [] for cfg in configs}
    cycles: dict[tuple, tuple[int, int]] = {}
    for rep in range(repeats):
        for cfg in configs:
            chain, window, bs = cfg
            reports: list[CycleReport] = []
            seconds, tokens = generate_all(pool, prompts, chain, window, bs, new_tokens, reports=reports)
            times[cfg].append(seconds)
            row_cycles = sum(len(r.emitted) for r in reports)
            cycles[cfg] = (tokens, row_cycles)
            print(f"  repeat {rep + 1}/{repeats} {chain_name(chain):>32} W={window} B={bs}: {seconds:6.2f} s",
                  file=sys.stderr)
    rows = []
    for cfg in configs:
        chain, window, bs = cfg
        base = statistics.median(times[((pool.target,), 1, bs)])
        t = statistics.median(times[cfg])
        tokens, row_cycles = cycles[cfg]
        rows.append({"chain": chain_name(chain), "window": window, "batch_size": bs,
                     "tokens_per_target_pass": tokens / row_cycles, "seconds": t,
                     "speedup_vs_target_only": base / t,
                     "spread": (max(times[cfg]) - min(times[cfg])) / t})
    return rows


def mask_vs_compaction(pool, prompts, new_tokens, repeats) -> dict:
    """The same batch-4 run with compaction whenever a hole appears vs holes left masked (never compacted)."""
    chain = (pool.by_size()[0], pool.target)
    settings = {"always_compact": 0.0, "default": EngineSettings().compact_hole_fraction, "mask_only": 1.01}
    times = {k: [] for k in settings}
    for _ in range(repeats):
        for name, fraction in settings.items():
            for e in pool.engines.values():
                e.settings = EngineSettings(compact_hole_fraction=fraction)
            times[name].append(generate_all(pool, prompts, chain, 4, 4, new_tokens)[0])
    for e in pool.engines.values():
        e.settings = EngineSettings()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"chain": chain_name(chain), "window": 4, "batch_size": 4, "seconds": med,
            "mask_only_over_always_compact": med["mask_only"] / med["always_compact"]}


def row_bytes(pool, prompts, new_tokens) -> list[dict]:
    """Bytes of distribution rows per cycle (one level handing up W rows per row of the batch)."""
    out = []
    chain = (pool.by_size()[0], pool.target)
    vocab = pool.engines[pool.target].vocab
    for label, params in [("greedy", GREEDY), ("temperature 1", SamplingParams(temperature=1.0)),
                          ("temperature 0.8, top-p 0.95", SamplingParams(temperature=0.8, top_p=0.95)),
                          ("temperature 0.8, top-k 50", SamplingParams(temperature=0.8, top_k=50))]:
        reports: list[CycleReport] = []
        generate_all(pool, prompts[:4], chain, 4, 4, new_tokens // 2, params=params, reports=reports)
        sizes, nonzeros = [], []
        for r in reports:
            for rows in r.results[chain[0]].rows:
                if rows is not None:
                    sizes += [wire.encode_row(x).nbytes for x in rows]
                    nonzeros += [int((x > 0).sum()) for x in rows]
        per_row = statistics.mean(sizes) if sizes else 0.0
        nnz = statistics.mean(nonzeros) if nonzeros else 0.0
        # a 32,000-token vocabulary: top-k keeps k entries; otherwise the same fraction stays non-zero
        nnz_32k = nnz if params.top_k else nnz * 32_000 / vocab
        per_row_32k = min(32_000 * wire.VALUE_BYTES, nnz_32k * (wire.INDEX_BYTES + wire.VALUE_BYTES))
        out.append({"sampling": label, "vocab": vocab, "nonzero_per_row": nnz, "bytes_per_row": per_row,
                    "token_id_bytes_per_cycle_B4_W4": 16 * 4,
                    "row_bytes_per_cycle_B4_W4": per_row * 16,
                    "row_bytes_per_cycle_B4_W4_vocab32000": per_row_32k * 16})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--windows", default="1,2,3,4,6")
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()

    torch.manual_seed(0)
    pool = InProcessPool.open(args.pool)
    prompts = [pool.encode(p) for p in heldout_code_prompts(args.prompts)]
    windows = [int(w) for w in args.windows.split(",")]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    print(f"pool {args.pool.name}: {pool.parameters}; {len(prompts)} prompts x {args.new_tokens} tokens; "
          f"{torch.get_num_threads()} threads", file=sys.stderr)
    result = {
        "acceptance": pair_acceptance(pool, prompts, args.new_tokens),
        "chains": chain_speedups(pool, prompts, windows, batch_sizes, args.new_tokens, args.repeats),
        "mask": mask_vs_compaction(pool, prompts, args.new_tokens, args.repeats),
        "row_bytes": row_bytes(pool, prompts, args.new_tokens),
    }
    print("\ngreedy acceptance per ordered pair (W=4):")
    for a in result["acceptance"]:
        print(f"  {a['drafter']:>12} -> {a['verifier']:<12} {a['acceptance']:.3f}  (mean accepted {a['mean_accepted']:.2f})")
    print("\nstatic chains (median of repeats; speedup over target-only at the same batch size):")
    print(f"  {'chain':>32} {'W':>2} {'B':>2} {'tok/pass':>8} {'seconds':>8} {'speedup':>8} {'spread':>7}")
    for c in result["chains"]:
        print(f"  {c['chain']:>32} {c['window']:>2} {c['batch_size']:>2} {c['tokens_per_target_pass']:8.2f} "
              f"{c['seconds']:8.2f} {c['speedup_vs_target_only']:8.2f} {c['spread']:7.1%}")
    m = result["mask"]
    print(f"\nmask vs compaction ({m['chain']}, W=4, B=4): " +
          ", ".join(f"{k} {v:.2f} s" for k, v in m["seconds"].items()) +
          f"; mask-only / always-compact = {m['mask_only_over_always_compact']:.3f}")
    print("\ndistribution rows on the wire (fp16; sparse when smaller; greedy sends none):")
    for r in result["row_bytes"]:
        print(f"  {r['sampling']:>28}: {r['nonzero_per_row']:6.0f} non-zero/row, {r['bytes_per_row']:6.0f} B/row; "
              f"per level and cycle at B=4 W=4: {r['token_id_bytes_per_cycle_B4_W4']} B of token ids + "
              f"{r['row_bytes_per_cycle_B4_W4']:,.0f} B of rows (vocab {r['vocab']}), "
              f"{r['row_bytes_per_cycle_B4_W4_vocab32000']:,.0f} B at vocab 32,000")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
