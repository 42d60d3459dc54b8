"""Pipelined against lock-step chains through the services, on the same worker processes.

    python -m benchmarks.pipelined --prompts P.jsonl [--kinds code,repetitive] [--worker-threads 1]
                                   [--chains stdlib-1m,stdlib-29m:3,stdlib-1m,stdlib-29m:4] [--rounds 3]
                                   [--device cuda] [--dtype float16]

Starts a local cluster (a worker process per model, as `specrouter up`) and two more routers over the same
workers, one with `--pipelined always` and one with `--pipelined auto` (pipelined where it measures faster
than lock-step), so all three run on the same processes and the same cores; then, per kind of prompt (a
`benchmarks.lookup --write-prompts` file) and chain, sends the prompts one at a time (batch 1, greedy, 64
new tokens) to each router in turn, rotating which goes first each round, and target-only to the lock-step
router as the baseline. Prints the machine line, tokens/s (median of the
rounds, min-max) and each configuration's breakdown per cycle: every level's round trip and forward passes,
the ahead draft's (run beside the verifiers: the drafter's time busy while the target works), and how many
ahead drafts the next cycle took and how many were thrown away, with the drafter's forward time spent on
those.

`--worker-threads 1` gives every worker one PyTorch thread (by default the target has one per core and the
other models one each), so that the levels running at once do not take each other's cores. `--device
cuda` runs every worker on the GPU (all on one device, as `specrouter up --device cuda` does); a GPU per
worker is the deployment pipelining is for (the `a100` overlay).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from specrouter.client import Client
from specrouter.launcher import MEASURING_ROUTER_ARGS, LocalCluster
from specrouter.pool.load import PoolDir
from specrouter.report.machine import machine_line

DEFAULT_POOL = Path(__file__).resolve().parents[1] / "models" / "demo-pool"
NEW_TOKENS = 64
MODES = ("lock-step", "always", "auto")   # the routers: --pipelined off, always, auto


def parse_chains(text: str) -> list[tuple[str, int]]:
    """"a,b:3,a,b:4" -> [("a,b", 3), ("a,b", 4)]: each chain ends with its window after a colon."""
    out, names = [], []
    for part in text.split(","):
        name, _, window = part.partition(":")
        names.append(name)
        if window:
            out.append((",".join(names), int(window)))
            names = []
    if names:
        raise SystemExit(f"--chains: {','.join(names)!r} has no window; write CHAIN:W, e.g. stdlib-1m,stdlib-29m:3")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, required=True, help="JSON lines of {kind, prompt}")
    parser.add_argument("--kinds", default="code,repetitive")
    parser.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    parser.add_argument("--chains", default="stdlib-1m,stdlib-29m:3,stdlib-1m,stdlib-29m:4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker-threads", type=int, default=0, help="PyTorch threads of every worker (0: the "
                        "launcher's default: the target one per core, the others one)")
    parser.add_argument("--device", default="cpu", help="the workers' device: cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="float32", help="the workers' dtype: float32, float16 or bfloat16")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    kinds = args.kinds.split(",")
    pool = PoolDir.open(args.pool)
    chains = [*parse_chains(args.chains), (pool.target, 0)]
    env = {"SPECROUTER_WORKER_TORCH_THREADS": str(args.worker_threads)} if args.worker_threads else None
    threads = f"{args.worker_threads} each" if args.worker_threads else "the target's default, the others' 1"
    print(f"{machine_line()}; workers on {args.device} in {args.dtype}, PyTorch threads: {threads}", flush=True)

    log_dir = Path(tempfile.mkdtemp(prefix="pipelined-"))
    cluster = LocalCluster(args.pool, log_dir, router_args=[*MEASURING_ROUTER_ARGS], env=env, gateway_port=None,
                           device=args.device, dtype=args.dtype)
    try:
        clients = {"lock-step": Client(cluster.router.address)}
        for mode in MODES[1:]:
            router = cluster.another_router(log_dir, [*MEASURING_ROUTER_ARGS, "--pipelined", mode], f"router-{mode}")
            clients[mode] = Client(router.address)
        for client in clients.values():   # every model warm on every router's path
            for chain, window in chains:
                client.generate("def f(x):\n    return", max_new_tokens=16, chain=chain, window=window)
        speeds: dict[tuple, list[float]] = defaultdict(list)
        sums: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for r in range(args.rounds):
            for kind in kinds:
                prompts = [row["prompt"] for row in rows if row["kind"] == kind]
                for chain, window in chains:
                    names = ["lock-step"] if window == 0 else [*MODES[r % 3:], *MODES[:r % 3]]
                    for name in names:
                        key, tokens, started = (kind, chain, window, name), 0, time.perf_counter()
                        for prompt in prompts:
                            g = clients[name].generate(prompt, max_new_tokens=NEW_TOKENS, chain=chain, window=window)
                            tokens += len(g.token_ids)
                            b, s = g.stats.breakdown, sums[key]
                            s["cycles"] += g.stats.cycles
                            s["cycle"] += b.cycle_ns
                            for model, t in b.levels.items():
                                s[f"{model} call"] += t.call_ns
                                s[f"{model} forward"] += t.forward_ns
                            s["ahead calls"] += b.ahead.calls
                            s["ahead call"] += b.ahead.call_ns
                            s["ahead forward"] += b.ahead.forward_ns
                            s["taken"] += b.cycles_from_ahead
                        speeds[key].append(tokens / (time.perf_counter() - started))
        print(f"\nbatch 1, greedy, {NEW_TOKENS} new tokens, {args.rounds} rounds (median tok/s, min-max); "
              "per cycle (ms): each level's round trip / forward passes")
        for key, values in speeds.items():
            kind, chain, window, name = key
            s = sums[key]
            n = s["cycles"]
            levels = "; ".join(f"{m.removesuffix(' call')} {s[m] / n / 1e6:.2f}/{s[m.replace('call', 'forward')] / n / 1e6:.2f}"
                               for m in sorted(s) if m.endswith(" call") and m != "ahead call" and s[m])
            line = (f"{kind:10s} {chain:34s} W{window} {name:9s} {statistics.median(values):6.1f} "
                    f"({min(values):.1f}-{max(values):.1f})  cycles {n:.0f}, {s['cycle'] / n / 1e6:.2f} ms: {levels}")
            if s["ahead calls"]:
                thrown = s["ahead calls"] - s["taken"]
                per_call = s["ahead forward"] / s["ahead calls"]
                line += (f"; ahead {s['ahead call'] / n / 1e6:.2f}/{s['ahead forward'] / n / 1e6:.2f}, taken by "
                         f"{s['taken']:.0f} of {s['ahead calls']:.0f} cycles, thrown away {thrown:.0f} "
                         f"({thrown * per_call / n / 1e6:.2f} ms forward a cycle)")
            print(line, flush=True)
        for kind in kinds:
            for chain, window in chains[:-1]:
                lock, always, auto = (statistics.median(speeds[(kind, chain, window, n)]) for n in MODES)
                print(f"{kind} {chain} W{window}: always/lock-step {always / lock:.2f}x, auto/lock-step "
                      f"{auto / lock:.2f}x, auto/the faster of the two {auto / max(lock, always):.2f}x")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
