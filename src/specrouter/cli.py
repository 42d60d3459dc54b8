"""The `specrouter` command line."""

from __future__ import annotations

import logging
import sys
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


DEFAULT_ROUTER = "127.0.0.1:50051"


def _fail(code: str, message: str) -> None:
    typer.echo(f"error: {code}: {message}", err=True)
    raise typer.Exit(1)


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="Text to continue."),
    router: str = typer.Option(DEFAULT_ROUTER, help="Router address HOST:PORT."),
    max_new_tokens: int = typer.Option(64),
    temperature: float = typer.Option(0.0, help="0 is greedy."),
    top_p: float = typer.Option(None, help="Nucleus mass in (0, 1]."),
    top_k: int = typer.Option(0),
    repetition_penalty: float = typer.Option(None),
    seed: int = typer.Option(None),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    chain: str = typer.Option("auto", help="auto, target, or NAME,NAME,... ending at the target."),
    window: int = typer.Option(0, help="Draft window W (0: the router's choice)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    in_process: bool = typer.Option(False, "--in-process", help="Run the pool in this process instead (no "
                                    "scheduler there: auto means the smallest model and the target, window 4)."),
    pool: Path = typer.Option(None, help="With --in-process: the pool directory."),
) -> None:
    """Generate a continuation of PROMPT through a router (or the pool in this process)."""
    import json

    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        _fail("INVALID_ARGUMENT", "the prompt is not valid UTF-8")
    if in_process:
        result = _generate_in_process(prompt, pool, max_new_tokens, temperature, top_p, top_k,
                                      repetition_penalty, seed, chain, window)
    else:
        from specrouter.client import Client, SpecRouterError

        params = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                      repetition_penalty=repetition_penalty, seed=seed, stop=stop, chain=chain, window=window)
        with Client(router) as client:
            try:
                if as_json:
                    r = client.generate(prompt, **params)
                    result = {"text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason,
                              "cycles": r.stats.cycles, "chain_counts": r.stats.chain_counts,
                              "accepted_per_level": r.stats.accepted_per_level, "seed": r.stats.seed,
                              "prompt_tokens": r.stats.prompt_tokens, "total_ms": r.stats.total_ns / 1e6}
                else:
                    for i, chunk in enumerate(client.generate_stream(prompt, **params)):
                        sys.stdout.write(prompt + chunk.text if i == 0 else chunk.text)
                        sys.stdout.flush()
                        if chunk.stats is not None:
                            st = chunk.stats
                            sys.stdout.write("\n")
                            typer.echo(f"[{st.generated_tokens} tokens in {st.total_ns / 1e9:.2f} s, {st.cycles} "
                                       f"cycles, chains {st.chain_counts}, finish {chunk.finish_reason}]", err=True)
                    return
            except SpecRouterError as exc:
                _fail(exc.code.name, exc.message)
    if as_json:
        print(json.dumps(result))
    else:
        sys.stdout.write(prompt + result["text"] + "\n")


def _generate_in_process(prompt, pool, max_new_tokens, temperature, top_p, top_k, repetition_penalty, seed,
                         chain, window) -> dict:
    from specrouter.pool.load import PoolDir
    from specrouter.pool.manifest import PoolError
    from specrouter.inprocess import InProcessPool, chain_name
    from specrouter.router.requests import parse_chain
    from specrouter.worker.calls import SamplingParams

    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=1.0 if top_p is None else top_p,
                            repetition_penalty=1.0 if repetition_penalty is None else repetition_penalty,
                            seed=seed or 0)
    try:
        params.validate()
        pool_dir = PoolDir.open(pool or default_pool())
        steps = parse_chain(chain, pool_dir.names, pool_dir.target)
        _quiet_transformers()
        local = InProcessPool(pool_dir)
        steps = steps or (local.by_size()[0], local.target)
        g = local.generate([prompt], steps, window or 4, params, max_new_tokens)[0]
    except (ValueError, PoolError) as exc:
        _fail("INVALID_ARGUMENT", str(exc))
    return {"text": g.text, "token_ids": g.token_ids, "finish_reason": g.finish_reason, "cycles": g.cycles,
            "chain_counts": dict(g.chain_counts), "accepted_per_level": g.accepted_per_level,
            "chain": chain_name(steps)}


@app.command()
def models(
    router: str = typer.Option(DEFAULT_ROUTER, help="Router address HOST:PORT."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List the pool's models (name, parameters, role)."""
    import json

    from specrouter.client import Client, SpecRouterError

    with Client(router, timeout_s=30) as client:
        try:
            found = client.models()
        except SpecRouterError as exc:
            _fail(exc.code.name, exc.message)
    if as_json:
        print(json.dumps([{"name": m.name, "parameters": m.parameters, "role": m.role, "address": m.address}
                          for m in found]))
        return
    for m in found:
        typer.echo(f"{m.name:<24} {m.parameters:>14,} {m.role:<7} {m.address}")


@app.command()
def up(
    pool: Path = typer.Option(None, help="Pool directory (default: the shipped demo pool)."),
    redis_url: str = typer.Option(None, help="Redis for the profiler's metrics (default: in memory)."),
    port: int = typer.Option(50051, help="Router port (0: a free one)."),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    log_dir: Path = typer.Option(Path(".cache/logs"), help="Each service's log file goes here."),
) -> None:
    """Start the embedded default: a profiler, one worker per pool model and a router, on localhost.

    A service that exits is started again on its port after a backoff (0.5 s, doubling to 30 s); the log
    says which, its exit code and the end of its log file. Ctrl-C or SIGTERM stops every service."""
    import signal
    import threading

    from specrouter.launcher import LocalCluster, Supervisor
    from specrouter.pool.manifest import PoolError

    _logging(False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    announce = lambda s: print(f"{s.name} up at {s.address}", flush=True)  # noqa: E731
    try:
        cluster = LocalCluster(pool or default_pool(), log_dir, port=port, redis_url=redis_url, dtype=dtype,
                               device=device, on_start=announce)
    except (PoolError, RuntimeError) as exc:
        _fail("FAILED_PRECONDITION", str(exc))
    print(f"router listening on {cluster.router.address}", flush=True)
    try:
        Supervisor(cluster.services, on_back=announce).run(stop)
    finally:
        cluster.stop()
    typer.echo("stopped", err=True)


def _int_list(text: str, name: str, empty: bool = False, most: int | None = None) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail("INVALID_ARGUMENT", f"--{name} takes integers separated by commas, got {text!r}")
    if not values and not empty:
        _fail("INVALID_ARGUMENT", f"--{name} needs at least one integer, got {text!r}")
    wrong = [v for v in values if v < 1 or (most is not None and v > most)]
    if wrong:
        bounds = f"from 1 to {most}" if most is not None else ">= 1"
        _fail("INVALID_ARGUMENT", f"--{name} takes integers {bounds}, got {', '.join(map(str, wrong))} in {text!r}")
    return values


@app.command("scheduler-report")
def scheduler_report(
    prompts: Path = typer.Option(None, help='JSON lines of {"kind": ..., "prompt": ...} (default: the held-out '
                                            "code, repetitive and prose workloads)."),
    batch_sizes: str = typer.Option("1,4,16", help="Requests in flight at a time, comma separated ('' with "
                                                   "--switching: the switching run alone)."),
    windows: str = typer.Option("1,2,3,4,5,6,7,8", help="Draft windows of the static configurations (1 to 16)."),
    max_new_tokens: int = typer.Option(48, help="Tokens per request."),
    repeats: int = typer.Option(1, help="Measured passes over every configuration (median reported)."),
    runoff_passes: int = typer.Option(2, help="Further passes of adaptive, target-only and the fastest statics, "
                                              "which the checks compare (0: none)."),
    runoff_top: int = typer.Option(2, help="Fastest statics of the screening that go to the run-off."),
    runoff_waves: int = typer.Option(8, help="More run-off passes where the batch size leaves fewer waves "
                                             "than this per configuration."),
    switching_runoff_passes: int = typer.Option(8, help="Run-off passes of the switching run, at least (its check "
                                                        "compares speeds a few percent apart)."),
    per_kind: int = typer.Option(16, help="Built-in prompts per workload kind."),
    requests: int = typer.Option(8, help="Requests per workload and batch size (whole waves of the batch size, two at least)."),
    temperature: float = typer.Option(0.0, help="0: greedy; > 0: sampling."),
    switching: str = typer.Option("prose>repetitive", help="A>B: a run of kind A then B ('' for none)."),
    switching_batch_sizes: str = typer.Option("1", help="Batch sizes of the switching run."),
    router: str = typer.Option(None, help="Use this router (HOST:PORT) instead of starting a local cluster."),
    pool: Path = typer.Option(None, help="Pool of the local cluster (default: the shipped demo pool)."),
    redis_url: str = typer.Option(None, help="Redis for the local cluster's profiler (default: in memory)."),
    out: Path = typer.Option(Path(".cache/scheduler-report"), help="Directory for report.json and report.png."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Measure every static (chain, window) against the adaptive scheduler and target-only, side by side."""
    import json
    import tempfile

    from specrouter.client import SpecRouterError
    from specrouter.report import workloads
    from specrouter.report.scheduler_report import ReportSettings, SchedulerReport, format_report, log_line
    from specrouter.router.requests import MAX_WINDOW

    _logging(verbose)
    if min(repeats, max_new_tokens, runoff_top, requests, per_kind) < 1:
        _fail("INVALID_ARGUMENT", "--repeats, --max-new-tokens, --runoff-top, --requests and --per-kind must be >= 1")
    if runoff_passes < 0 or runoff_waves < 0 or switching_runoff_passes < 0:
        _fail("INVALID_ARGUMENT", "--runoff-passes, --runoff-waves and --switching-runoff-passes must be >= 0 "
              "(--runoff-passes 0: no run-off)")
    pair = None
    if switching:
        if ">" not in switching:
            _fail("INVALID_ARGUMENT", f"--switching takes KIND>KIND, got {switching!r}")
        a, b = (x.strip() for x in switching.split(">", 1))
        pair = (a, b)
    try:
        items = workloads.load_prompts(prompts) if prompts else workloads.builtin_prompts(per_kind)
    except (OSError, ValueError) as exc:
        _fail("INVALID_ARGUMENT", str(exc))
    kinds = {p.kind for p in items}
    if pair and not set(pair) <= kinds:
        _fail("INVALID_ARGUMENT", f"--switching {switching!r} names kinds not among the prompts' {sorted(kinds)}")
    settings = ReportSettings(batch_sizes=_int_list(batch_sizes, "batch-sizes", empty=pair is not None), windows=_int_list(windows, "windows", most=MAX_WINDOW),
                              max_new_tokens=max_new_tokens, repeats=repeats, requests=requests,
                              temperature=temperature, switching=pair, runoff_passes=runoff_passes,
                              runoff_top=runoff_top, runoff_waves=runoff_waves,
                              switching_runoff_passes=switching_runoff_passes,
                              switching_batch_sizes=_int_list(switching_batch_sizes, "switching-batch-sizes"))
    cluster = None
    try:
        if router is None:
            from specrouter.launcher import LocalCluster

            log_line("starting a local cluster of the pool ...")
            cluster = LocalCluster(pool or default_pool(), Path(tempfile.mkdtemp(prefix="specrouter-report-")),
                                   port=0, redis_url=redis_url, on_start=lambda s: log_line(f"{s.name} up at {s.address}"))
            router = cluster.router.address
        report = SchedulerReport(router, settings, say=log_line).run(items)
    except SpecRouterError as exc:   # a router (given with --router) that refuses or fails a request
        _fail(exc.code.name, exc.message)
    finally:
        if cluster is not None:
            cluster.stop()
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    from specrouter.report.chart import write_chart

    chart = write_chart(report, out / "report.png")
    if as_json:
        print(json.dumps(report))
    else:
        typer.echo(format_report(report))
    log_line(f"wrote {out / 'report.json'} and {chart}")


BENCH_PER_KIND = 16   # built-in prompts per kind the bench draws from (cycled where a cell needs more)


@app.command()
def bench(
    pool: Path = typer.Option(None, help="Pool directory: the local cluster's and the in-process peers' models "
                                         "(default: the shipped demo pool)."),
    router: str = typer.Option(None, help="Use this router (HOST:PORT) instead of starting a local cluster; "
                                          "--pool must be its pool."),
    prompts: Path = typer.Option(None, help='JSON lines of {"kind": ..., "prompt": ...} (default: the built-in '
                                            "code, repetitive and prose workloads)."),
    kinds: str = typer.Option(None, help="Kinds to run, comma separated; 'switching' is prose then repetitive "
                                         "(default: code,repetitive,prose,switching, or the prompts file's kinds)."),
    batch_sizes: str = typer.Option("1,4,16", help="Requests in flight at a time, comma separated."),
    requests: int = typer.Option(8, help="Requests per kind and batch size (at least two waves, whole waves)."),
    max_new_tokens: int = typer.Option(64, help="Tokens per request."),
    rounds: int = typer.Option(3, help="Interleaved measured rounds (median and range reported)."),
    windows: str = typer.Option("2,3,4,5,6", help="Draft windows the two-level screening searches."),
    three_level_window: int = typer.Option(4, help="Draft window of the three-level chain."),
    redis_url: str = typer.Option(None, help="Redis for the local cluster's profiler (default: in memory)."),
    out: Path = typer.Option(Path(".cache/bench"), help="Directory for bench.json, bench.md and bench.png."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Measure SpecRouter through its services against transformers in this process (greedy)."""
    import json

    from specrouter.client import SpecRouterError
    from specrouter.pool.load import PoolDir
    from specrouter.pool.manifest import PoolError
    from specrouter.report import workloads
    from specrouter.report.bench import (DEFAULT_KINDS, SWITCHING, SWITCHING_PAIR, BenchError, BenchSettings,
                                         RichProgress, check_kinds, run_bench)
    from specrouter.report.bench_format import check_lines, format_markdown, report_json, write_chart
    from specrouter.report.scheduler_report import log_line
    from specrouter.router.requests import MAX_WINDOW

    _logging(verbose)
    if min(requests, max_new_tokens, rounds) < 1:
        _fail("INVALID_ARGUMENT", "--requests, --max-new-tokens and --rounds must be >= 1")
    if not 1 <= three_level_window <= MAX_WINDOW:
        _fail("INVALID_ARGUMENT", f"--three-level-window takes 1 to {MAX_WINDOW}, got {three_level_window}")
    sizes, searched = _int_list(batch_sizes, "batch-sizes"), _int_list(windows, "windows", most=MAX_WINDOW)
    try:
        items = workloads.load_prompts(prompts) if prompts else workloads.builtin_prompts(BENCH_PER_KIND)
    except (OSError, ValueError) as exc:
        _fail("INVALID_ARGUMENT", str(exc))
    if kinds is None:
        present = list(dict.fromkeys(p.kind for p in items))
        switching = [SWITCHING] if set(SWITCHING_PAIR) <= set(present) else []
        asked = DEFAULT_KINDS if prompts is None else present + switching
    else:
        asked = list(dict.fromkeys(k.strip() for k in kinds.split(",") if k.strip()))
    try:
        if not asked:
            raise BenchError(f"--kinds needs at least one kind, got {kinds!r}")
        check_kinds(items, asked)
        pool_dir = PoolDir.open(pool or default_pool()).directory
    except (BenchError, PoolError) as exc:
        _fail("INVALID_ARGUMENT", str(exc))
    settings = BenchSettings(kinds=tuple(asked), batch_sizes=tuple(sizes), requests=requests,
                             max_new_tokens=max_new_tokens, rounds=rounds, windows=tuple(searched),
                             three_level_window=three_level_window)
    _quiet_transformers()
    try:
        with RichProgress() as progress:
            report = run_bench(pool_dir, settings, items, router=router, redis_url=redis_url, progress=progress,
                               say=log_line)
    except SpecRouterError as exc:
        _fail(exc.code.name, exc.message)
    except (BenchError, RuntimeError) as exc:   # a router of another pool; a cluster that did not start
        _fail("FAILED_PRECONDITION", str(exc))
    out.mkdir(parents=True, exist_ok=True)
    data = report_json(report)
    (out / "bench.json").write_text(json.dumps(data, indent=2) + "\n")
    markdown = format_markdown(report)
    (out / "bench.md").write_text(markdown)
    chart = write_chart(report, out / "bench.png")
    if as_json:
        print(json.dumps(data))
    else:
        typer.echo(markdown)
        typer.echo("\n".join(check_lines(report)))
    log_line(f"wrote {out / 'bench.json'}, {out / 'bench.md'} and {chart}")


@app.command()
def soak(
    clients: int = typer.Option(16, help="Concurrent clients."),
    duration: str = typer.Option("10m", help="How long the load is measured: 90s, 10m, 1h (a plain number is seconds)."),
    warmup: str = typer.Option("30s", help="Load before the measurement, not counted; RSS at start is read after it."),
    grace: str = typer.Option("30s", help="How long requests in flight at the deadline may take before they are cancelled."),
    cancel_fraction: float = typer.Option(0.25, help="Fraction of the clients that cancel their streams after a few "
                                                     "tokens or close their channel mid-stream."),
    max_new_tokens: int = typer.Option(48, help="Most tokens a request asks for (each asks for 8 up to this)."),
    max_rss_growth: float = typer.Option(10.0, help="Fail when a process's RSS grows by more than this many percent."),
    seed: int = typer.Option(0, help="Seeds the clients' choices of prompt, kind and sampling seed."),
    router: str = typer.Option(None, help="Use this router (HOST:PORT) instead of starting a local cluster (RSS: n/a)."),
    pool: Path = typer.Option(None, help="Pool of the local cluster (default: the shipped demo pool)."),
    redis_url: str = typer.Option(None, help="Redis for the local cluster's profiler (default: in memory)."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as one JSON object."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Load a router with concurrent clients for a bounded time; exit 1 on errors, live states or RSS growth."""
    import json

    from specrouter.client import SpecRouterError
    from specrouter.pool.manifest import PoolError
    from specrouter.report.scheduler_report import log_line
    from specrouter.report.soak import SoakSettings, format_soak, run_soak, soak_failures

    _logging(verbose)
    try:
        settings = SoakSettings.parse(clients=clients, duration=duration, warmup=warmup, grace=grace,
                                      cancel_fraction=cancel_fraction, max_new_tokens=max_new_tokens,
                                      max_rss_growth=max_rss_growth, seed=seed)
    except ValueError as exc:
        _fail("INVALID_ARGUMENT", str(exc))
    try:
        report = run_soak(settings, router=router, pool_dir=pool or default_pool(), redis_url=redis_url, say=log_line)
    except SpecRouterError as exc:   # a router (given with --router) that cannot be reached
        _fail(exc.code.name, exc.message)
    except (PoolError, RuntimeError) as exc:   # a pool that does not open; a cluster that did not start
        _fail("FAILED_PRECONDITION", str(exc))
    typer.echo(json.dumps(report) if as_json else format_soak(report))
    failures = soak_failures(report)
    for line in failures:
        typer.echo(f"FAIL: {line}", err=True)
    if failures:
        raise typer.Exit(1)


@app.command()
def healthcheck(
    address: str = typer.Argument(..., help="Server address HOST:PORT."),
    service: str = typer.Option("", help="Service name to ask about ('': the server as a whole)."),
    timeout: float = typer.Option(5.0, help="Seconds to wait for the answer."),
) -> None:
    """Exit 0 if the server at ADDRESS is SERVING on the standard gRPC health protocol, else 1 with why."""
    from specrouter.healthcheck import check

    result = check(address, service, timeout)
    typer.echo(result.reason, err=not result.serving)
    if not result.serving:
        raise typer.Exit(1)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(ctx: typer.Context, service: str = typer.Argument(..., help="router, worker or profiler")) -> None:
    """Run one service in the foreground (for containers); its own options follow."""
    import importlib

    if service not in ("router", "worker", "profiler"):
        _fail("INVALID_ARGUMENT", f"unknown service {service!r}: choose router, worker or profiler")
    module = importlib.import_module(f"specrouter.{service}.__main__")
    raise typer.Exit(module.main(list(ctx.args)))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
