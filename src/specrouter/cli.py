"""The `specrouter` command line."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from specrouter.cli_support import (DEFAULT_ROUTER, TLS_CA, TLS_CERT, TLS_KEY, TOKEN_FILE, client_tls, default_pool,
                                   fail, quiet_transformers, router_client, setup_logging)
from specrouter.report import commands as report_commands

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
DEFAULT_GATEWAY_PORT = 8000


@app.callback()
def _root() -> None:
    """SpecRouter: lossless, adaptive, multi-level speculative decoding."""


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
    setup_logging(verbose)
    import torch

    from specrouter.pool.build import BuildPlan, build_pool
    from specrouter.progress import progress_bar

    if threads:
        torch.set_num_threads(threads)
    plan = BuildPlan(seed=seed, target_steps=target_steps, mid_steps=mid_steps,
                     drafter_steps=drafter_steps, bf16=bf16)
    build_pool(out, work, plan, progress_bar)


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
    tls_ca: Path = TLS_CA, tls_cert: Path = TLS_CERT, tls_key: Path = TLS_KEY, token_file: Path = TOKEN_FILE,
) -> None:
    """Generate a continuation of PROMPT through a router (or the pool in this process)."""
    import json

    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        fail("INVALID_ARGUMENT", "the prompt is not valid UTF-8")
    if in_process:
        result = _generate_in_process(prompt, pool, max_new_tokens, temperature, top_p, top_k,
                                      repetition_penalty, seed, chain, window, stop)
    else:
        from specrouter.client import SpecRouterError

        params = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                      repetition_penalty=repetition_penalty, seed=seed, stop=stop, chain=chain, window=window)
        with router_client(router, 300.0, tls_ca, tls_cert, tls_key, token_file) as client:
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
                fail(exc.code.name, exc.message)
    if as_json:
        print(json.dumps(result))
    else:
        sys.stdout.write(prompt + result["text"] + "\n")


def _generate_in_process(prompt, pool, max_new_tokens, temperature, top_p, top_k, repetition_penalty, seed,
                         chain, window, stop) -> dict:
    from specrouter.pool.load import PoolDir
    from specrouter.pool.manifest import PoolError
    from specrouter.inprocess import InProcessPool, chain_name
    from specrouter.router.lookup import LOOKUP
    from specrouter.router.requests import parse_chain
    from specrouter.contract.calls import SamplingParams

    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=1.0 if top_p is None else top_p,
                            repetition_penalty=1.0 if repetition_penalty is None else repetition_penalty,
                            seed=seed or 0, coupled=seed is not None)
    try:
        params.validate()
        pool_dir = PoolDir.open(pool or default_pool())
        steps = parse_chain(chain, [LOOKUP, *pool_dir.names], pool_dir.target, {LOOKUP})
        quiet_transformers()
        local = InProcessPool(pool_dir)
        steps = steps or (local.by_size()[0], local.target)
        g = local.generate([prompt], steps, window or 4, params, max_new_tokens, stop=stop)[0]
    except (ValueError, PoolError) as exc:
        fail("INVALID_ARGUMENT", str(exc))
    return {"text": g.text, "token_ids": g.token_ids, "finish_reason": g.finish_reason, "cycles": g.cycles,
            "chain_counts": dict(g.chain_counts), "accepted_per_level": g.accepted_per_level,
            "chain": chain_name(steps)}


@app.command()
def models(
    router: str = typer.Option(DEFAULT_ROUTER, help="Router address HOST:PORT."),
    as_json: bool = typer.Option(False, "--json"),
    tls_ca: Path = TLS_CA, tls_cert: Path = TLS_CERT, tls_key: Path = TLS_KEY, token_file: Path = TOKEN_FILE,
) -> None:
    """List the pool's models (name, parameters, role, address), and the lookup level."""
    import json

    from specrouter.client import SpecRouterError

    with router_client(router, 30, tls_ca, tls_cert, tls_key, token_file) as client:
        try:
            found = client.models(levels=True)
        except SpecRouterError as exc:
            fail(exc.code.name, exc.message)
    if as_json:
        print(json.dumps([{"name": m.name, "parameters": m.parameters, "role": m.role, "address": m.address}
                          for m in found]))
        return
    for m in found:
        typer.echo(f"{m.name:<24} {m.parameters:>14,} {m.role:<7} {m.address or 'in the router (no model)'}")


@app.command()
def up(
    pool: Path = typer.Option(None, help="Pool directory (default: the shipped demo pool)."),
    redis_url: str = typer.Option(None, help="Redis for the profiler's metrics (default: in memory)."),
    port: int = typer.Option(50051, help="Router port (0: a free one)."),
    dtype: str = typer.Option("float32"),
    device: str = typer.Option("cpu"),
    log_dir: Path = typer.Option(Path(".cache/logs"), help="Each service's log file goes here."),
    tls_ca: Path = typer.Option(None, "--tls-ca", help="With --tls-cert and --tls-key: TLS on every channel; "
                                "the CA that signs the services' certificate (the workers and the profiler "
                                "take only clients it signed)."),
    tls_cert: Path = typer.Option(None, "--tls-cert", help="Certificate (PEM) every service serves with; it "
                                  "must name 127.0.0.1 and allow client use (the router presents it too)."),
    tls_key: Path = typer.Option(None, "--tls-key", help="The private key (PEM) of --tls-cert."),
    auth_token_file: Path = typer.Option(None, help="File holding the bearer token the router requires (or set "
                                         "SPECROUTER_ROUTER_AUTH_TOKEN)."),
    gateway_port: int = typer.Option(None, help="Port of the OpenAI-compatible HTTP gateway [default: 8000, or a "
                                     "free one with --port 0]; 0: a free one; -1: no gateway.", show_default=False),
    models_in_router: bool = typer.Option(False, "--models-in-router", help="Serve the pool's models in the "
                                          "router's own process instead of one worker process each: no RPC per "
                                          "chain level, faster where the models share one host's cores."),
    pipelined: str = typer.Option("off", "--pipelined", metavar="off|auto|always", help="The drafter drafts the "
                                  "next window while the levels above verify this one: auto where the router "
                                  "measures it faster than lock-step (it pays where each worker has a device or "
                                  "cores of its own), always in every cycle (docs/pipelined.md)."),
) -> None:
    """Start the embedded default: a profiler, one worker per pool model, a router and the OpenAI-compatible
    HTTP gateway, on localhost (with --models-in-router, no workers: the router holds the models).

    A service that exits is started again on its port after a backoff (0.5 s, doubling to 30 s); the log
    says which, its exit code and the end of its log file. Ctrl-C or SIGTERM stops every service. Each
    service serves Prometheus metrics on a free port: `NAME metrics at URL` says where."""
    import signal
    import threading

    from specrouter.launcher import ClusterTLS, LocalCluster, Supervisor
    from specrouter.pool.manifest import PoolError

    tls = None
    if tls_ca or tls_cert or tls_key:
        if not (tls_ca and tls_cert and tls_key):
            fail("INVALID_ARGUMENT", "TLS for the cluster needs --tls-ca, --tls-cert and --tls-key together")
        client_tls(tls_ca, tls_cert, tls_key)   # each file readable, before any service starts
        tls = ClusterTLS(tls_ca.resolve(), tls_cert.resolve(), tls_key.resolve())
    router_args = ["--auth-token-file", str(auth_token_file.resolve())] if auth_token_file else []
    if pipelined not in ("off", "auto", "always"):
        fail("INVALID_ARGUMENT", f"--pipelined takes off, auto or always, got {pipelined!r}")
    if pipelined != "off" and models_in_router:
        fail("INVALID_ARGUMENT", "--pipelined runs the drafter's worker beside the verifiers'; with "
             "--models-in-router every level runs on the router's one compute thread: drop one of them")
    if pipelined != "off":
        router_args += ["--pipelined", pipelined]
    if gateway_port is None:
        gateway_port = 0 if port == 0 else DEFAULT_GATEWAY_PORT

    setup_logging(False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    def announce(service) -> None:
        print(f"{service.name} up at {service.address}", flush=True)
        if service.metrics_url:
            print(f"{service.name} metrics at {service.metrics_url}", flush=True)

    try:
        cluster = LocalCluster(pool or default_pool(), log_dir, port=port, redis_url=redis_url, dtype=dtype,
                               device=device, on_start=announce, router_args=router_args, tls=tls,
                               gateway_port=None if gateway_port < 0 else gateway_port,
                               models_in_router=models_in_router)
    except (PoolError, RuntimeError) as exc:
        fail("FAILED_PRECONDITION", str(exc))
    print(f"router listening on {cluster.router.address}", flush=True)
    if cluster.gateway is not None:
        print(f"gateway listening on {cluster.gateway.address}", flush=True)
    try:
        Supervisor(cluster.services, on_back=announce).run(stop)
    finally:
        cluster.stop()
    typer.echo("stopped", err=True)


@app.command()
def healthcheck(
    address: str = typer.Argument(..., help="Server address HOST:PORT, or the gateway's URL "
                                  "(http://HOST:PORT/health)."),
    service: str = typer.Option("", help="Service name to ask about ('': the server as a whole)."),
    timeout: float = typer.Option(5.0, help="Seconds to wait for the answer."),
    tls_ca: Path = TLS_CA, tls_cert: Path = TLS_CERT, tls_key: Path = TLS_KEY,
) -> None:
    """Exit 0 if the server at ADDRESS is SERVING on the standard gRPC health protocol (a URL: answers 200),
    else 1 with why."""
    from specrouter.healthcheck import check, check_http

    if address.startswith(("http://", "https://")):
        result = check_http(address, timeout, str(tls_ca) if tls_ca else None)
    else:
        result = check(address, service, timeout, client_tls(tls_ca, tls_cert, tls_key))
    typer.echo(result.reason, err=not result.serving)
    if not result.serving:
        raise typer.Exit(1)


SERVICES = ("router", "worker", "profiler", "gateway")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def serve(ctx: typer.Context, service: str = typer.Argument(None, help="router, worker, profiler or gateway",
                                                             show_default=False)) -> None:
    """Run one service in the foreground (for containers); its own options follow
    (`specrouter serve router --help` lists them)."""
    import importlib

    if service is None or service in ("--help", "-h"):
        typer.echo(ctx.get_help())
        raise typer.Exit(0 if service is not None or "--help" in ctx.args else 2)
    if service not in SERVICES:
        fail("INVALID_ARGUMENT", f"unknown service {service!r}: choose {', '.join(SERVICES[:-1])} or {SERVICES[-1]}")
    module = importlib.import_module(f"specrouter.{service}.__main__")
    raise typer.Exit(module.main(list(ctx.args)))


app.command("scheduler-report")(report_commands.scheduler_report)
app.command()(report_commands.bench)
app.command()(report_commands.soak)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
