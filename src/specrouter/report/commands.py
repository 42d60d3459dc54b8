"""The measuring commands of `specrouter`: `scheduler-report`, `bench` and `soak`. `specrouter.cli` registers
them; each loads what it measures with only when it runs."""

from __future__ import annotations

from pathlib import Path

import typer

from specrouter.cli_support import default_pool, fail, quiet_transformers, setup_logging


def int_list(text: str, name: str, empty: bool = False, most: int | None = None) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail("INVALID_ARGUMENT", f"--{name} takes integers separated by commas, got {text!r}")
    if not values and not empty:
        fail("INVALID_ARGUMENT", f"--{name} needs at least one integer, got {text!r}")
    wrong = [v for v in values if v < 1 or (most is not None and v > most)]
    if wrong:
        bounds = f"from 1 to {most}" if most is not None else ">= 1"
        fail("INVALID_ARGUMENT", f"--{name} takes integers {bounds}, got {', '.join(map(str, wrong))} in {text!r}")
    return values


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
    models_in_router: bool = typer.Option(False, "--models-in-router", help="The local cluster's router holds "
                                          "the models (`specrouter up --models-in-router`): no worker processes."),
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

    setup_logging(verbose)
    if min(repeats, max_new_tokens, runoff_top, requests, per_kind) < 1:
        fail("INVALID_ARGUMENT", "--repeats, --max-new-tokens, --runoff-top, --requests and --per-kind must be >= 1")
    if runoff_passes < 0 or runoff_waves < 0 or switching_runoff_passes < 0:
        fail("INVALID_ARGUMENT", "--runoff-passes, --runoff-waves and --switching-runoff-passes must be >= 0 "
              "(--runoff-passes 0: no run-off)")
    if models_in_router and router:
        fail("INVALID_ARGUMENT", "--models-in-router applies when the report starts its own services; with "
                                 "--router it starts none")
    pair = None
    if switching:
        if ">" not in switching:
            fail("INVALID_ARGUMENT", f"--switching takes KIND>KIND, got {switching!r}")
        a, b = (x.strip() for x in switching.split(">", 1))
        pair = (a, b)
    try:
        items = workloads.load_prompts(prompts) if prompts else workloads.builtin_prompts(per_kind)
    except (OSError, ValueError) as exc:
        fail("INVALID_ARGUMENT", str(exc))
    kinds = {p.kind for p in items}
    if pair and not set(pair) <= kinds:
        fail("INVALID_ARGUMENT", f"--switching {switching!r} names kinds not among the prompts' {sorted(kinds)}")
    settings = ReportSettings(batch_sizes=int_list(batch_sizes, "batch-sizes", empty=pair is not None), windows=int_list(windows, "windows", most=MAX_WINDOW),
                              max_new_tokens=max_new_tokens, repeats=repeats, requests=requests,
                              temperature=temperature, switching=pair, runoff_passes=runoff_passes,
                              runoff_top=runoff_top, runoff_waves=runoff_waves,
                              switching_runoff_passes=switching_runoff_passes,
                              switching_batch_sizes=int_list(switching_batch_sizes, "switching-batch-sizes"))
    cluster = None
    try:
        if router is None:
            from specrouter.launcher import MEASURING_ROUTER_ARGS, LocalCluster

            log_line("starting a local cluster of the pool ...")
            cluster = LocalCluster(pool or default_pool(), Path(tempfile.mkdtemp(prefix="specrouter-report-")),
                                   port=0, redis_url=redis_url, on_start=lambda s: log_line(f"{s.name} up at {s.address}"),
                                   router_args=list(MEASURING_ROUTER_ARGS), models_in_router=models_in_router)
            router = cluster.router.address
        report = SchedulerReport(router, settings, say=log_line).run(items)
    except SpecRouterError as exc:   # a router (given with --router) that refuses or fails a request
        fail(exc.code.name, exc.message)
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


def bench(
    pool: Path = typer.Option(None, help="Pool directory: the local cluster's and the in-process rows' models "
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
    runoff_rounds: int = typer.Option(8, help="At batch sizes above 1, rounds of adaptive and the static "
                                              "configuration fastest over the rounds, alternating, after them "
                                              "(the batched cells' check reads them; 0: none)."),
    windows: str = typer.Option("2,3,4,5,6", help="Draft windows the two-level screening searches."),
    three_level_window: int = typer.Option(4, help="Draft window of the three-level chain."),
    lookup_window: int = typer.Option(8, help="Draft window of the lookup chain (lookup -> target)."),
    redis_url: str = typer.Option(None, help="Redis for the local cluster's profiler (default: in memory)."),
    device: str = typer.Option("cpu", help="Device of the local cluster's workers and of the in-process rows "
                                           "(cpu, cuda, cuda:1, ...); with --router, that router's workers' device."),
    dtype: str = typer.Option("float32", help="float32, float16 or bfloat16, on both sides."),
    models_in_router: bool = typer.Option(False, "--models-in-router", help="The local cluster's router holds "
                                          "the models (`specrouter up --models-in-router`): no worker processes."),
    out: Path = typer.Option(Path(".cache/bench"), help="Directory for bench.json, bench.md and bench.png."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Measure SpecRouter through its services against transformers and its own engine in this process (greedy)."""
    import json

    from specrouter.client import SpecRouterError
    from specrouter.pool.load import PoolDir, parse_dtype
    from specrouter.pool.manifest import PoolError
    from specrouter.report import workloads
    from specrouter.report.bench import (DEFAULT_KINDS, SWITCHING, SWITCHING_PAIR, BenchError, BenchSettings,
                                         RichProgress, check_kinds, run_bench)
    from specrouter.report.bench_format import check_lines, format_markdown, report_json, write_chart
    from specrouter.report.scheduler_report import log_line
    from specrouter.router.requests import MAX_WINDOW

    setup_logging(verbose)
    if min(requests, max_new_tokens, rounds) < 1:
        fail("INVALID_ARGUMENT", "--requests, --max-new-tokens and --rounds must be >= 1")
    if runoff_rounds < 0:
        fail("INVALID_ARGUMENT", f"--runoff-rounds must be >= 0 (0: no run-off), got {runoff_rounds}")
    if models_in_router and router:
        fail("INVALID_ARGUMENT", "--models-in-router applies when the bench starts its own services; with "
                                 "--router it starts none")
    if not 1 <= three_level_window <= MAX_WINDOW:
        fail("INVALID_ARGUMENT", f"--three-level-window takes 1 to {MAX_WINDOW}, got {three_level_window}")
    if not 1 <= lookup_window <= MAX_WINDOW:
        fail("INVALID_ARGUMENT", f"--lookup-window takes 1 to {MAX_WINDOW}, got {lookup_window}")
    sizes, searched = int_list(batch_sizes, "batch-sizes"), int_list(windows, "windows", most=MAX_WINDOW)
    try:
        items = workloads.load_prompts(prompts) if prompts else workloads.builtin_prompts(BENCH_PER_KIND)
    except (OSError, ValueError) as exc:
        fail("INVALID_ARGUMENT", str(exc))
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
        parse_dtype(dtype)
    except (BenchError, PoolError) as exc:
        fail("INVALID_ARGUMENT", str(exc))
    settings = BenchSettings(kinds=tuple(asked), batch_sizes=tuple(sizes), requests=requests,
                             max_new_tokens=max_new_tokens, rounds=rounds, runoff_rounds=runoff_rounds,
                             windows=tuple(searched), three_level_window=three_level_window, lookup_window=lookup_window,
                             device=device, dtype=dtype, models_in_router=models_in_router)
    quiet_transformers()
    try:
        with RichProgress() as progress:
            report = run_bench(pool_dir, settings, items, router=router, redis_url=redis_url, progress=progress,
                               say=log_line)
    except SpecRouterError as exc:
        fail(exc.code.name, exc.message)
    except (BenchError, RuntimeError) as exc:   # a router of another pool; a cluster that did not start
        fail("FAILED_PRECONDITION", str(exc))
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
    from specrouter.report.soak import SoakSettings, run_soak
    from specrouter.report.soak_results import format_soak, soak_failures

    setup_logging(verbose)
    try:
        settings = SoakSettings.parse(clients=clients, duration=duration, warmup=warmup, grace=grace,
                                      cancel_fraction=cancel_fraction, max_new_tokens=max_new_tokens,
                                      max_rss_growth=max_rss_growth, seed=seed)
    except ValueError as exc:
        fail("INVALID_ARGUMENT", str(exc))
    try:
        report = run_soak(settings, router=router, pool_dir=pool or default_pool(), redis_url=redis_url, say=log_line)
    except SpecRouterError as exc:   # a router (given with --router) that cannot be reached
        fail(exc.code.name, exc.message)
    except (PoolError, RuntimeError) as exc:   # a pool that does not open; a cluster that did not start
        fail("FAILED_PRECONDITION", str(exc))
    typer.echo(json.dumps(report) if as_json else format_soak(report))
    failures = soak_failures(report)
    for line in failures:
        typer.echo(f"FAIL: {line}", err=True)
    if failures:
        raise typer.Exit(1)
