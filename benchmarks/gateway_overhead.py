"""The OpenAI-compatible gateway's cost per request: the same greedy requests through the gateway (HTTP) and
directly through the gRPC SDK, against one local cluster (`specrouter up`'s services, the gateway included).

    python -m benchmarks.gateway_overhead [--pool DIR] [--prompts 6] [--new-tokens 32] [--rounds 5]

Each round sends every prompt both ways, one request at a time, in alternating order (whole answers, then
streams read to their last chunk); the gateway's answer must carry the SDK's token ids. Target-only
decoding, so that both ways do the same work. Prints the machine, then per mode the median time of each
way and the median of the paired differences (the gateway's overhead per request).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from specrouter import Client
from specrouter.launcher import LocalCluster
from specrouter.pool.prompts import heldout_code_prompts
from specrouter.report.machine import machine_line

DEFAULT_POOL = Path(__file__).resolve().parents[1] / "models" / "demo-pool"


def via_sdk(client: Client, prompt: str, new_tokens: int, stream: bool) -> list[int]:
    params = dict(max_new_tokens=new_tokens, chain="target")
    if not stream:
        return client.generate(prompt, **params).token_ids
    return [t for chunk in client.generate_stream(prompt, **params) for t in chunk.token_ids]


def via_gateway(http: httpx.Client, model: str, prompt: str, new_tokens: int, stream: bool) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "chain": "target",
            "stream": stream}
    if not stream:
        reply = http.post("/v1/completions", json=body)
        reply.raise_for_status()
        return reply.json()["choices"][0]["specrouter"]["token_ids"]
    tokens = []
    with http.stream("POST", "/v1/completions", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                tokens += json.loads(line.removeprefix("data: "))["choices"][0]["specrouter"]["token_ids"]
    return tokens


def timed(call) -> tuple[float, list[int]]:
    started = time.perf_counter()
    tokens = call()
    return time.perf_counter() - started, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    prompts = heldout_code_prompts(args.prompts)
    print(machine_line())
    with tempfile.TemporaryDirectory() as logs:
        cluster = LocalCluster(args.pool, Path(logs), gateway_port=0)
        try:
            with Client(cluster.router.address) as client, \
                    httpx.Client(base_url=f"http://{cluster.gateway.address}", timeout=300) as http:
                model = next(m.name for m in client.models() if m.role == "target")
                for stream in (False, True):   # warm both paths
                    via_sdk(client, prompts[0], 4, stream)
                    via_gateway(http, model, prompts[0], 4, stream)
                for stream in (False, True):
                    sdk_s, gateway_s, overhead_s = [], [], []
                    for r in range(args.rounds):
                        for i, prompt in enumerate(prompts):
                            ways = [lambda: via_sdk(client, prompt, args.new_tokens, stream),
                                    lambda: via_gateway(http, model, prompt, args.new_tokens, stream)]
                            first_sdk = (r + i) % 2 == 0
                            (a, ta), (b, tb) = (timed(w) for w in (ways if first_sdk else ways[::-1]))
                            (direct, direct_tokens), (gateway, gateway_tokens) = \
                                ((a, ta), (b, tb)) if first_sdk else ((b, tb), (a, ta))
                            if gateway_tokens != direct_tokens:
                                raise SystemExit(f"the gateway's tokens differ from the SDK's for {prompt!r}")
                            sdk_s.append(direct)
                            gateway_s.append(gateway)
                            overhead_s.append(gateway - direct)
                    mode = "stream" if stream else "whole"
                    print(f"{mode:>6}: {len(sdk_s)} requests of {args.new_tokens} tokens, target-only; median "
                          f"direct {statistics.median(sdk_s) * 1e3:.1f} ms, gateway "
                          f"{statistics.median(gateway_s) * 1e3:.1f} ms, overhead per request "
                          f"{statistics.median(overhead_s) * 1e3:.2f} ms "
                          f"({statistics.median(overhead_s) / statistics.median(sdk_s):.1%})")
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
