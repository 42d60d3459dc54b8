"""The lookup level against transformers' prompt lookup: greedy, batch 1, tokens per second.

    python -m benchmarks.lookup [--pool DIR] [--prompts 8] [--new-tokens 64] [--rounds 3]
                                [--kinds code,repetitive] [--no-services] [--json FILE]
    python -m benchmarks.lookup --write-prompts FILE [--prompts 32]

The second form writes `--prompts` prompts of each kind as JSON lines, for `specrouter bench --prompts FILE`
(batched runs on the same held-out text).

Two kinds of held-out text: Python code from third-party packages installed beside SpecRouter (unlike the
pool's standard-library corpus), and repetitive tables (`report.workloads`). Each round runs prompts of its
own (`--prompts` a kind), so that no request repeats one the router ran before (the lookup also copies
from earlier requests, and would copy a repeated prompt's whole answer). On each kind, in interleaved
rounds (medians printed), what a user would run in one process with transformers (`generate`, assisted
generation with the smallest drafter, prompt lookup: `report.peers`), SpecRouter's
chains in this process (the router's chain step over the pool's engines), and the same chains through a
local cluster's services (SDK -> router -> workers). Every output is checked against the target's own
greedy ids; ratios are to transformers' `generate` in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from specrouter.inprocess import InProcessPool
from specrouter.report import peers as hf
from specrouter.report.machine import machine_line
from specrouter.report.workloads import REPETITIVE, repetitive_prompts
from specrouter.router.lookup import LOOKUP
from specrouter.contract.calls import SamplingParams

DEFAULT_POOL = Path(__file__).resolve().parents[1] / "models" / "demo-pool"
THIRD_PARTY = ("redis", "grpc", "click", "typer", "opentelemetry", "pydantic", "hypothesis")   # installed beside
CODE = "code"
PROMPT_CHARS = 700


def third_party_code_prompts(n: int) -> list[str]:
    """`n` snippets of Python from third-party packages, deterministic: from every k-th file (sorted), the
    lines from its middle up to PROMPT_CHARS characters, cut mid-line."""
    import importlib.util
    files = []
    for package in THIRD_PARTY:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            for root in spec.submodule_search_locations:
                files += sorted(p for p in Path(root).rglob("*.py") if p.stat().st_size > 4 * PROMPT_CHARS)
    if len(files) < n:
        raise SystemExit(f"found {len(files)} third-party source files, need {n}")
    out = []
    for f in files[:: max(1, len(files) // n)][:n]:
        lines = f.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        text = "".join(lines[len(lines) // 2:])[:PROMPT_CHARS]
        out.append(text[: text.rfind("\n") + 1 + 12])
    return out


def configurations(local: InProcessPool) -> list[tuple[str, tuple[str, ...], int]]:
    small, _, target = local.by_size()
    return [("target only", (target,), 0), (f"{small} -> target", (small, target), 3),
            ("lookup -> target", (LOOKUP, target), 8), (f"lookup -> {small} -> target", (LOOKUP, small, target), 6)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default=f"{CODE},{REPETITIVE}")
    ap.add_argument("--no-services", action="store_true", help="Measure in process only.")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--write-prompts", type=Path, help="Write the prompts as JSON lines and exit.")
    args = ap.parse_args(argv)
    if args.write_prompts:
        with args.write_prompts.open("w", encoding="utf-8") as out:
            for kind, texts in ((CODE, third_party_code_prompts(args.prompts)),
                                (REPETITIVE, repetitive_prompts(args.prompts))):
                out.writelines(json.dumps({"kind": kind, "prompt": t}) + "\n" for t in texts)
        return 0
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    print(machine_line())
    local = InProcessPool.open(args.pool)
    peers = hf.PeerModels.load(args.pool)
    small = local.by_size()[0]
    kinds = args.kinds.split(",")
    total = args.prompts * args.rounds
    every = {CODE: third_party_code_prompts(total) if CODE in kinds else [],
             REPETITIVE: repetitive_prompts(total)}
    # round r's prompts of each kind: the r-th slice
    texts = {(k, r): every[k][r * args.prompts:(r + 1) * args.prompts] for k in kinds for r in range(args.rounds)}
    prompts = {key: [local.encode(t) for t in ts] for key, ts in texts.items()}
    n = args.new_tokens

    # each run takes (text, its ids) and returns the new token ids
    runs = {"transformers generate": lambda text, ids: hf.generate_target(peers, ids, n),
            f"transformers assisted ({small})": lambda text, ids: hf.generate_assisted(peers, small, ids, n),
            "transformers prompt lookup": lambda text, ids: hf.generate_prompt_lookup(peers, ids, n)}
    for label, chain, window in configurations(local):
        runs[f"in process: {label}"] = (lambda c, w: lambda text, ids: local.generate_ids(
            [ids], c, w, [SamplingParams()], n)[0].generated)(chain, window)

    cluster = client = None
    logs = tempfile.TemporaryDirectory()
    if not args.no_services:
        from specrouter import Client
        from specrouter.launcher import LocalCluster
        cluster = LocalCluster(args.pool, Path(logs.name))
        client = Client(cluster.router.address, timeout_s=600)
        for label, chain, window in [*configurations(local), ("auto", (), 0)]:
            runs[f"services: {label}"] = (lambda c, w: lambda text, ids: client.generate(
                text, max_new_tokens=n, chain=",".join(c) or "auto", window=w).token_ids)(chain, window)
    try:
        reference = {key: [hf.generate_target(peers, ids, n) for ids in ps] for key, ps in prompts.items()}
        seconds: dict[tuple[str, str], list[float]] = {}
        tokens: dict[tuple[str, str], list[int]] = {}
        wrong: set[tuple[str, str]] = set()
        warm = local.encode("def warm_up(self):\n    return self")   # a prompt of no round
        for label, run in runs.items():   # warm every path once
            run("def warm_up(self):\n    return self", warm)
        for r in range(args.rounds):
            for kind in kinds:
                for label, run in runs.items():
                    start = time.perf_counter()
                    outs = [run(text, ids) for text, ids in zip(texts[(kind, r)], prompts[(kind, r)])]
                    seconds.setdefault((kind, label), []).append(time.perf_counter() - start)
                    tokens.setdefault((kind, label), []).append(sum(len(o) for o in outs))
                    if outs != reference[(kind, r)]:
                        wrong.add((kind, label))
            print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    finally:
        if cluster is not None:
            client.close()
            cluster.stop()
        logs.cleanup()
    results = {}
    for kind in kinds:
        # per round, tokens per second; a configuration's ratio is the median of its per-round ratios to
        # `generate` on the same prompts
        rate = {label: [t / s for t, s in zip(tokens[(kind, label)], seconds[(kind, label)])] for label in runs}
        base = rate["transformers generate"]
        print(f"\n{kind}: {args.prompts} prompts a round, {n} new tokens, batch 1, greedy, "
              f"median of {args.rounds} rounds")
        for label in runs:
            speed = statistics.median(rate[label])
            ratio = statistics.median(x / b for x, b in zip(rate[label], base))
            results[f"{kind}/{label}"] = {"tokens_per_s": speed, "over_generate": ratio}
            flag = "  OUTPUT DIFFERS" if (kind, label) in wrong else ""
            print(f"  {label:<40} {speed:7.1f} tok/s  {ratio:5.2f}x generate{flag}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(), "results": results}, indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
