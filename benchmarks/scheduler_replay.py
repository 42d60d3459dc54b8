"""The adaptive scheduler replayed on the demo pool's greedy acceptance: deterministic, in seconds.

    python -m benchmarks.scheduler_replay traces [--pool DIR] [--per-kind 8] [--new-tokens 48] --out FILE
    python -m benchmarks.scheduler_replay run --traces FILE [--passes 3] [--batch-size 1] [--requests 8]
                                              [--pass-ms MODEL=MS,...] [--call-ms 8.7]
                                              [--growth MODEL=FRACTION,...] [--scheduler JSON]
                                              [--runoff-top K]

`scheduler-report` measures the scheduler on a live cluster, where one configuration measures 5-10%
apart from one pass to the next; a change worth 2% takes many half-hour runs to see. Under greedy
decoding a two-level cycle's outcome is decided by the tokens alone: drafting `w` tokens at position t of
the target's continuation accepts min(L(t), w), where L(t) is how many of the drafter's greedy tokens
from the true prefix match the target's. `traces` records L(t) for every drafter of the pool at every
position of every prompt's continuation (and the models' prompt agreement, as the prefill reports it);
`run` drives the real `Scheduler` and an in-process profiler store through those cycles, as the report's
workloads send them (every wave run by `auto`, then by static configurations that feed the profiler
too), and charges each cycle a fixed cost: per model pass `--pass-ms`, per call `--call-ms` (a round
trip and the router's work; the defaults are fitted to the batch-1 cycle times of the report's statics
on a 2-core machine: 1m,29m at window w costs 29.6 + 4.24 w ms, the target alone 25.2). The scheduler
learns those costs as it would live (latency table from the warm-up profile, call overheads from the
cycles), so its predicted cost is the charged one and what the replay measures is its acceptance side:
estimates, shifts, hysteresis, the tail factor and exploration. Chains of three models are not
replayed (the middle model's verification is not in the traces), so candidates are two-level.

With `--batch-size B` the requests go in waves of B, batched from the first cycle until the last row has
its tokens (a row leaves when it has them, as in the report's waves); a cycle of b rows is charged each
pass and call times 1 + g (b - 1), g per model and for the call from `--growth`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specrouter.profiler import codec
from specrouter.profiler.memory_store import MemoryStore
from specrouter.contract.measures import EmaConstants
from specrouter.profiler.metrics import Update
from specrouter.profiler.resilient import ResilientMetrics
from specrouter.report.scheduler_report import Config
from specrouter.router.chain import TARGET_ONLY_BLOCK
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row, prompt_agreement
from specrouter.router.measurements import cycle_measurements
from specrouter.router.scheduling.scheduler import Scheduler
from specrouter.router.scheduling.settings import SchedulerSettings
from specrouter.router.scheduling.snapshot import Snapshot
from specrouter.router.settings import RouterSettings
from specrouter.contract.calls import ForwardTiming, SamplingParams, StepResult

DEFAULT_POOL = Path(__file__).resolve().parents[1] / "models" / "demo-pool"
# per pass and per call, least squares over the mean cycle times of the batch-1 two-level and target-only
# statics (windows 2, 4, 6 and 8; code, tables, prose and the switching stream) of one scheduler report:
# run 19 in benchmarks/RESULTS.md. A fixed cost per cycle is what lets the replay rank scheduler changes
# exactly; what it leaves out (the context's cost, timing noise) is what the live report measures.
PASS_MS = {"stdlib-1m": 4.24, "stdlib-5m": 8.76, "stdlib-29m": 20.77}
CALL_MS = 4.44
# what a row beyond the first adds to a pass, as a fraction of one row's: forward passes at batch 1 and 4
# over a 200-token context, one thread; the call's is a guess (sampling and messages grow with the rows)
GROWTH = {"stdlib-1m": 0.1, "stdlib-5m": 0.3, "stdlib-29m": 0.2, "call": 0.1}
SNAPSHOT_S = RouterSettings.model_fields["snapshot_refresh_s"].default   # the router's poll of the profiler
FILLER = 7            # token id of replayed emitted tokens (the scheduler reads counts, not ids)


# -- traces ---------------------------------------------------------------------------------------------

def build_traces(pool_dir: Path, per_kind: int, new_tokens: int, depth: int = 8,
                 prompt_positions: int = 128) -> dict:
    import torch

    from specrouter.pool.load import load_model, load_tokenizer
    from specrouter.pool.manifest import PoolManifest
    from specrouter.report.workloads import builtin_prompts

    manifest = PoolManifest.load(pool_dir)
    names = [m.name for m in manifest.members]
    models = {n: load_model(manifest.model_dir(pool_dir, n)).eval() for n in names}
    tokenizer = load_tokenizer(manifest.model_dir(pool_dir, manifest.target))

    @torch.no_grad()
    def greedy(name: str, ids: list[int], n: int) -> list[int]:
        out = models[name].generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                    pad_token_id=0, eos_token_id=None)
        return out[0, len(ids):].tolist()

    prompts = []
    started = time.monotonic()
    chosen, seen = [], Counter()
    for p in builtin_prompts():   # the report's workloads: the first of each kind of its built-in set
        seen[p.kind] += 1
        if seen[p.kind] <= per_kind:
            chosen.append(p)
    for i, p in enumerate(chosen):
        ids = tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
        continuation = greedy(manifest.target, ids, new_tokens + depth)
        accepted = {}
        for name in names:
            if name == manifest.target:
                continue
            lengths = []
            for t in range(new_tokens):
                draft = greedy(name, ids + continuation[:t], depth)
                k = 0
                while k < depth and draft[k] == continuation[t + k]:
                    k += 1
                lengths.append(k)
            accepted[name] = lengths
        with torch.no_grad():
            guesses = {n: m(torch.tensor([ids])).logits[0, -prompt_positions:].argmax(-1).tolist()
                       for n, m in models.items()}
        agreement = [[a, b, same, n] for (a, b), (same, n) in prompt_agreement(guesses).items()]
        prompts.append({"kind": p.kind, "prompt_ids": ids, "accepted": accepted, "agreement": agreement})
        print(f"[{i + 1}/{len(chosen)}, {time.monotonic() - started:.0f} s] {p.kind}: mean accepted "
              + ", ".join(f"{n} {sum(v) / len(v):.2f}" for n, v in accepted.items()), file=sys.stderr, flush=True)
    return {"target": manifest.target, "models": names, "new_tokens": new_tokens, "depth": depth,
            "prompts": prompts}


# -- replay ---------------------------------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Batch:
    """What the scheduler reads of a ChainBatch: its rows."""

    def __init__(self, rows: Sequence[Row]):
        self.rows = {row.row_id: row for row in rows}


@dataclass(frozen=True)
class Costs:
    pass_ms: Mapping[str, float]
    call_ms: float
    # per model (and "call" for the call): what each row beyond the first adds, as a fraction of one row's
    growth: Mapping[str, float] = field(default_factory=dict)

    def pass_at(self, model: str, batch: int) -> float:
        return self.pass_ms[model] * (1 + self.growth.get(model, 0.0) * (batch - 1))

    def call_at(self, batch: int) -> float:
        return self.call_ms * (1 + self.growth.get("call", 0.0) * (batch - 1))

    def warmup(self) -> dict[str, list[tuple[int, int, int]]]:
        """A worker's warm-up profile: a pass costs the same at any width."""
        return {m: [(b, k, int(self.pass_at(m, b) * 1e6)) for b in (1, 2, 4, 8, 16) for k in range(1, 17)]
                for m in self.pass_ms}

    def cycle_ms(self, chain: Sequence[str], window: int, batch: int = 1, block: int = TARGET_ONLY_BLOCK) -> float:
        """A cycle's wall time; the target alone decodes `block` tokens in its one call, as the router runs it."""
        if len(chain) == 1:
            return self.call_at(batch) + block * self.pass_at(chain[0], batch)
        return 2 * self.call_at(batch) + window * self.pass_at(chain[0], batch) + self.pass_at(chain[1], batch)


class Replay:
    """One router's scheduler and one profiler, fed cycle by cycle from the traces."""

    def __init__(self, traces: dict, costs: Costs, settings: SchedulerSettings,
                 acceptance_alpha: float = EmaConstants.acceptance_alpha):
        self.traces, self.costs = traces, costs
        self.target = traces["target"]
        self.clock = _Clock()
        self.metrics = ResilientMetrics(MemoryStore(EmaConstants.ema_alpha, acceptance_alpha), clock=self.clock)
        self._snapshot: Snapshot | None = None
        self._snapshot_at = -1.0
        self.scheduler = Scheduler(traces["models"], self.target, settings.model_copy(update={"max_levels": 2}),
                                   self.snapshot, warmup=costs.warmup(), clock=self.clock)
        self.picks: Counter[tuple[tuple[str, ...], int]] = Counter()
        self._rows = 0

    def snapshot(self) -> Snapshot:
        if self._snapshot is None or self.clock.now - self._snapshot_at >= SNAPSHOT_S:
            view = self.metrics.snapshot()
            self._snapshot = Snapshot.of(view.metrics, view.constants.acceptance_alpha)
            self._snapshot_at = self.clock.now
        return self._snapshot

    def run(self, prompt: dict, static: tuple[tuple[str, ...], int] | None = None) -> float:
        """One request of `new_tokens` at batch 1, by `auto` (static None) or a static configuration; its ms."""
        return self.run_wave([prompt], static)

    def run_wave(self, prompts: Sequence[dict], static: tuple[tuple[str, ...], int] | None = None) -> float:
        """One request of `new_tokens` per prompt, in one batch from the first cycle to the last row's (a
        row leaves the batch when it has its tokens), by `auto` (static None) or a static configuration;
        the wave's ms."""
        rows = []
        for prompt in prompts:
            self._rows += 1
            ids = prompt["prompt_ids"]
            row = Row(f"r{self._rows}", list(ids), len(ids), SamplingParams(), self.traces["new_tokens"])
            row.seen = {m: len(ids) - 1 for m in self.traces["models"]}
            row.spec = {m: [] for m in self.traces["models"]}
            row.prompt_agreement = {(a, b): (same, n) for a, b, same, n in prompt["agreement"]}
            rows.append((row, prompt))
        batch = _Batch([row for row, _ in rows])
        total = 0.0
        while batch.rows:
            chain, window = static if static is not None else self.scheduler.choose(batch)
            decision = self.scheduler.decision_for(batch) if static is None else None
            running = [(row, prompt) for row, prompt in rows if row.row_id in batch.rows]
            live = [row for row, _ in running]
            # a catch-up is one wider pass: flat, like any pass here; the target alone decodes a block,
            # no longer than the rows still want
            block = min(TARGET_ONLY_BLOCK, max(r.max_new_tokens - len(r.generated) for r in live))
            ms = self.costs.cycle_ms(chain, window, len(running), block)
            accepted = [min(prompt["accepted"][chain[0]][len(row.generated)], window) if len(chain) > 1 else block - 1
                        for row, prompt in running]
            report = self._report(chain, window, live, accepted, block)
            self.clock.now += ms / 1e3
            measured = cycle_measurements(report, live)   # what the router sends the profiler
            self.metrics.report([Update.of(s) for s in codec.samples_from_pb(measured)])
            self.scheduler.observe(report, live, int(ms * 1e6), static is None, decision)
            for row in live:
                row.tokens += report.emitted[row.row_id]
                for m in chain:
                    row.seen[m] = len(row.tokens) - 1
                if len(row.generated) >= row.max_new_tokens:
                    del batch.rows[row.row_id]
            total += ms
            if static is None:
                self.picks[(tuple(chain), window if len(chain) > 1 else 0)] += 1
        return total

    def _report(self, chain: Sequence[str], window: int, rows: Sequence[Row], accepted: Sequence[int],
                block: int) -> CycleReport:
        """The cycle as the router reports it: each call its passes (at the table's cost) and the call's
        overhead, so that the scheduler learns the replay's costs. A row emits its accepted tokens and the
        verifier's (the target alone: its block), up to its tokens left."""
        results, call_ns = {}, {}
        batch = len(rows)
        for level, model in enumerate(chain):
            passes = (window if len(chain) > 1 else block) if level == 0 else 1
            width = window + 1 if level > 0 else 1
            pass_ns = int(self.costs.pass_at(model, batch) * 1e6)
            results[model] = StepResult(tokens=[], rows=[], timings=[ForwardTiming(pass_ns, batch, width, width)
                                                                    for _ in range(passes)])
            call_ns[model] = passes * pass_ns + int(self.costs.call_at(batch) * 1e6)
        verifier = chain[-1]
        emitted = {r.row_id: [FILLER] * min(a + 1, r.max_new_tokens - len(r.generated)) for r, a in zip(rows, accepted)}
        return CycleReport(tuple(chain), window, emitted=emitted,
                           accepted={verifier: list(accepted)} if len(chain) > 1 else {},
                           proposed={verifier: [window] * batch} if len(chain) > 1 else {},
                           results=results, call_ns=call_ns)


def statics(traces: dict, windows: Sequence[int]) -> list[tuple[tuple[str, ...], int]]:
    target = traces["target"]
    drafters = [m for m in traces["models"] if m != target]
    return [((target,), 0)] + [((d, target), w) for d in drafters for w in windows]


def replay_workloads(traces: dict, costs: Costs, settings: SchedulerSettings, passes: int = 3,
                     windows: Sequence[int] = (2, 4, 6, 8), requests: int = 8,
                     acceptance_alpha: float = EmaConstants.acceptance_alpha,
                     switching: Sequence[tuple[str, str]] = (("prose", "repetitive"),), batch: int = 1,
                     runoff_top: int = 0) -> list[dict]:
    """The report's cells at one batch size on one router: each kind, then each switching stream (A's
    requests, then B's), in waves of `batch` requests, each wave by `auto` then every static; ms per token
    per configuration over `passes`, and what the best configuration per wave, picked with hindsight, would
    have taken (`hindsight`).

    With `runoff_top` K, each cell runs as the report runs it: one screening pass of every configuration,
    then `passes` run-off passes of `auto`, the K statics fastest in the screening and target-only, which
    alone are counted. Fewer configurations per wave feed the profiler fewer checks of each new kind of
    text, so the pool's rates follow a change of workload over more of `auto`'s waves."""
    by_kind: dict[str, list[dict]] = {}
    for p in traces["prompts"]:
        by_kind.setdefault(p["kind"], []).append(p)
    cells = [(kind, ps[:requests]) for kind, ps in by_kind.items()]
    for a, b in switching:
        if a in by_kind and b in by_kind:
            cells.append((f"switching:{a}>{b}", by_kind[a][:requests] + by_kind[b][:requests]))
    replay = Replay(traces, costs, settings, acceptance_alpha)
    configs = statics(traces, windows)
    out = []
    for kind, prompts in cells:
        waves = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
        running = configs
        if runoff_top > 0:
            screening = _run_passes(replay, waves, configs, 1)
            ranked = sorted((c for c in configs if len(c[0]) > 1), key=lambda c: screening[_label(c)])
            running = [c for c in configs if len(c[0]) == 1] + ranked[:runoff_top]
        replay.picks.clear()
        ms = _run_passes(replay, waves, running, passes)
        tokens = passes * len(prompts) * traces["new_tokens"]
        per_token = {k: v / tokens for k, v in ms.items()}
        best = min((k for k in per_token if k not in ("auto", "hindsight")), key=per_token.get)
        out.append({"kind": kind, "batch_size": batch, "ms_per_token": per_token, "best_static": best,
                    "auto_speed_over_best_static": per_token[best] / per_token["auto"],
                    "hindsight_speed_over_best_static": per_token[best] / per_token["hindsight"],
                    "auto_picks": {_label(c): n for c, n in replay.picks.most_common()}})
    return out


def _run_passes(replay: Replay, waves: Sequence[Sequence[dict]], configs: Sequence[tuple[tuple[str, ...], int]],
                passes: int) -> Counter[str]:
    """ms per configuration (and `auto`, and `hindsight`: the best of `configs` per wave) over `passes`
    passes of the waves, each wave by `auto` and then by each configuration."""
    ms: Counter[str] = Counter()
    for _ in range(passes):
        for wave in waves:
            ms["auto"] += replay.run_wave(wave)
            each = {_label(config): replay.run_wave(wave, config) for config in configs}
            ms.update(each)
            ms["hindsight"] += min(each.values())
    return ms


def _label(config: tuple[tuple[str, ...], int]) -> str:
    return Config(*config).label()   # as the report names it


def _pass_ms(text: str) -> dict[str, float]:
    return _per_model(text, PASS_MS)


def _per_model(text: str, defaults: Mapping[str, float]) -> dict[str, float]:
    out = dict(defaults)
    for item in filter(None, text.split(",")):
        name, _, ms = item.partition("=")
        out[name.strip()] = float(ms)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("traces", help="record the pool's greedy acceptance lengths on the built-in prompts")
    t.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    t.add_argument("--per-kind", type=int, default=8)
    t.add_argument("--new-tokens", type=int, default=48)
    t.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run", help="replay the scheduler and every static configuration on recorded traces")
    r.add_argument("--traces", type=Path, required=True)
    r.add_argument("--passes", type=int, default=3)
    r.add_argument("--windows", default="2,4,6,8")
    r.add_argument("--pass-ms", default="", help="per model pass, e.g. stdlib-1m=1.41 (defaults: %s)" % PASS_MS)
    r.add_argument("--call-ms", type=float, default=CALL_MS)
    r.add_argument("--batch-size", type=int, default=1, help="requests per wave, batched together")
    r.add_argument("--requests", type=int, default=8, help="requests per kind (the traces' first)")
    r.add_argument("--growth", default="", help="per model (and 'call'), what each row beyond the first adds "
                   "to a pass (a call) as a fraction of one row's, e.g. stdlib-29m=0.2 (defaults: %s)" % GROWTH)
    r.add_argument("--acceptance-alpha", type=float, default=EmaConstants.acceptance_alpha)
    r.add_argument("--scheduler", default="{}", help="SchedulerSettings overrides as JSON")
    r.add_argument("--switching", default="prose>repetitive", help="switching streams, e.g. prose>code,code>prose")
    r.add_argument("--runoff-top", type=int, default=0,
                   help="as the report: a screening pass of every static, then run-off passes of auto, the "
                   "this many fastest statics and target-only (0: every static in every pass)")
    r.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "traces":
        traces = build_traces(args.pool, args.per_kind, args.new_tokens)
        args.out.write_text(json.dumps(traces))
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    traces = json.loads(args.traces.read_text())
    costs = Costs(_pass_ms(args.pass_ms), args.call_ms, _per_model(args.growth, GROWTH))
    missing = sorted(set(traces["models"]) - set(costs.pass_ms))
    if missing:
        parser.error(f"no pass cost for {missing}: give them with --pass-ms MODEL=MS")
    settings = SchedulerSettings(**json.loads(args.scheduler))
    cells = replay_workloads(traces, costs, settings, args.passes, [int(w) for w in args.windows.split(",")],
                             acceptance_alpha=args.acceptance_alpha,
                             switching=[tuple(x.strip() for x in pair.split(">", 1))
                                        for pair in args.switching.split(",") if ">" in pair],
                             batch=args.batch_size, requests=args.requests,
                             runoff_top=args.runoff_top)
    if args.json:
        print(json.dumps(cells, indent=1))
        return 0
    for c in cells:
        ms, best = c["ms_per_token"], c["best_static"]
        print(f"{c['kind']:28s} auto {ms['auto']:6.2f} ms/token; best static {best} {ms[best]:.2f}; "
              f"auto = {c['auto_speed_over_best_static']:.3f} x its speed, "
              f"hindsight {c['hindsight_speed_over_best_static']:.3f}")
        print("    statics: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(ms.items(), key=lambda kv: kv[1])
                                         if k not in ("auto", "hindsight")))
        print("    auto ran: " + ", ".join(f"{k} {n}" for k, n in list(c["auto_picks"].items())[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
