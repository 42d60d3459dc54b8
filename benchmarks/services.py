"""The services against the engine in process: router overhead, round trips and bytes per cycle.

    python -m benchmarks.services [--pool DIR] [--prompts 6] [--new-tokens 48] [--repeats 3]

1. Target-only generation of the same prompts, one request at a time: through `specrouter up`'s router
   (client -> router -> worker processes) against the pool in this process. Interleaved, repeated,
   median; the ratio is the router's overhead.
2. A three-level chain driven over gRPC exactly as the router drives it: worker RPCs and bytes per cycle,
   greedy and sampling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from specrouter import Client
from specrouter.launcher import LocalCluster
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.router.chain import ChainBatch, run_to_completion
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.inprocess import InProcessPool
from specrouter.router.remote import RemoteWorker
from specrouter.contract.calls import SamplingParams

DEFAULT_POOL = Path(__file__).resolve().parents[1] / "models" / "demo-pool"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()

    local = InProcessPool.open(args.pool)
    prompts = heldout_code_prompts(args.prompts)
    ids = [local.encode(p) for p in prompts]
    with tempfile.TemporaryDirectory() as logs:
        cluster = LocalCluster(args.pool, Path(logs))
        try:
            client = Client(cluster.router.address)
            client.generate(prompts[0], max_new_tokens=4, chain="target")  # warm the path
            times = {"services": [], "in_process": []}
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                for p in prompts:
                    client.generate(p, max_new_tokens=args.new_tokens, chain="target")
                times["services"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for i in ids:
                    local.generate_ids([i], (local.target,), 1, [SamplingParams()], args.new_tokens)
                times["in_process"].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            tokens = args.prompts * args.new_tokens
            print(f"target-only, batch 1, {args.prompts} prompts x {args.new_tokens} tokens, median of {args.repeats}:")
            for k, v in med.items():
                print(f"  {k:>10}: {v:6.2f} s  ({tokens / v:6.1f} tok/s, spread {(max(times[k]) - min(times[k])) / v:.1%})")
            print(f"  services / in process = {med['services'] / med['in_process']:.3f}")

            workers = {w.name: w for w in (RemoteWorker(s.address) for s in cluster.services if s.name.startswith("worker-"))}
            chain = tuple(local.by_size())
            for label, params in [("greedy", SamplingParams()), ("sampling t=0.8", SamplingParams(temperature=0.8, seed=1)),
                                  ("sampling t=0.8 top-k 50", SamplingParams(temperature=0.8, top_k=50, seed=1))]:
                for bs in (1, 4):
                    for w in workers.values():
                        w.calls = w.bytes_sent = w.bytes_received = 0
                    batch = ChainBatch(workers, local.target, local.context_length)
                    batch.add([Row(f"r{i}", list(p), len(p), params, args.new_tokens) for i, p in enumerate(ids[:bs])])
                    reports: list[CycleReport] = []
                    run_to_completion(batch, lambda _: (chain, 4), reports.append)
                    cycles = len(reports)
                    calls = sum(w.calls for w in workers.values()) - len(workers)  # less the prefills
                    sent = sum(w.bytes_sent for w in workers.values())
                    received = sum(w.bytes_received for w in workers.values())
                    print(f"{','.join(chain)} W=4 B={bs} {label}: {cycles} cycles, "
                          f"{calls / cycles:.2f} worker RPCs/cycle (incl. releases), "
                          f"{(sent + received) / cycles:,.0f} bytes/cycle ({sent / cycles:,.0f} sent, "
                          f"{received / cycles:,.0f} received)")
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
