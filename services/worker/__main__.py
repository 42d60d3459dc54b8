"""`python -m specrouter.worker --model-dir DIR [--port N] ...`: serve one model over gRPC."""

from __future__ import annotations

import argparse
import os
import logging
import signal
import sys
import threading

from specrouter.worker.compute import ComputeLoop
from specrouter.worker.settings import WorkerSettings


def parse_settings(argv: list[str] | None) -> WorkerSettings:
    ap = argparse.ArgumentParser(prog="specrouter serve worker", description=__doc__)
    for name, field in WorkerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        ap.add_argument(flag, dest=name, default=None, help=f"(env SPECROUTER_WORKER_{name.upper()})")
    given = {k: v for k, v in vars(ap.parse_args(argv)).items() if v is not None}
    return WorkerSettings(**given)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from specrouter.worker import server as srv

    settings = parse_settings(argv)
    from specrouter import tracing

    tracing.configure("specrouter-worker", os.environ)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    engine, info = srv.build_engine(settings)
    compute = ComputeLoop()
    grpc_server, port, health = srv.create_server(settings, engine, info, compute)
    grpc_server.start()
    srv.warm_up(engine, info, settings.profile_batch_sizes, settings.profile_tokens_per_row)
    srv.mark_serving(health, True)
    # handlers before the "listening" line: a supervisor may stop the worker as soon as it reads it
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"worker {info.model_name} listening on {settings.host}:{port}", flush=True)
    reaper = threading.Thread(target=_reap, args=(engine, stop), daemon=True)
    reaper.start()
    compute.run(until=stop)   # the engine's work, on this (the main) thread, until a signal
    srv.mark_serving(health, False)
    grpc_server.stop(settings.grace_s).wait()
    logging.getLogger(__name__).info("worker %s stopped", info.model_name)
    tracing.shutdown()
    return 0


def _reap(engine, stop: threading.Event) -> None:
    """Reclaims abandoned states between requests, not only when the next request arrives."""
    period = max(1.0, engine.settings.state_ttl_s / 10)
    while not stop.wait(period):
        expired = engine.reclaim_expired()
        if expired:
            logging.getLogger(__name__).info("reclaimed %d abandoned states", len(expired))


if __name__ == "__main__":
    sys.exit(main())
