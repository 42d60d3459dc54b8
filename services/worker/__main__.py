"""`python -m specrouter.worker --model-dir DIR [--port N] ...`: serve one model over gRPC."""

from __future__ import annotations

import logging
import sys
import threading

from pydantic import ValidationError

from specrouter import lifecycle, prometheus
from specrouter.tls import CredentialsError, server_tls
from specrouter.worker.compute import ComputeLoop
from specrouter.worker.settings import WorkerSettings


def parse_settings(argv: list[str] | None) -> WorkerSettings:
    return lifecycle.settings_from_flags(WorkerSettings, argv, prog="specrouter serve worker", description=__doc__)


def main(argv: list[str] | None = None) -> int:
    lifecycle.configure_logging()
    try:   # the TLS files are read before the model loads: a missing one stops the worker at once
        settings = parse_settings(argv)
        tls = server_tls(settings, mutual_only=True)
    except (ValidationError, CredentialsError) as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    from specrouter.worker import server as srv

    def open_worker() -> lifecycle.Running:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        engine, info = srv.build_engine(settings)
        compute = ComputeLoop()
        metrics = srv.worker_metrics(engine, info)
        grpc_server, port, health = srv.create_server(settings, engine, info, compute, tls, metrics)
        grpc_server.start()
        endpoint = prometheus.serve_metrics(metrics.registry, settings.host, settings.metrics_port)
        srv.warm_up(engine, info, settings.profile_batch_sizes, settings.profile_tokens_per_row)
        srv.mark_serving(health, True)

        def work(stop: threading.Event) -> None:
            threading.Thread(target=_reap, args=(engine, stop), daemon=True).start()
            compute.run(until=stop)   # the engine's work, on this (the main) thread, until a signal

        def close() -> None:
            srv.mark_serving(health, False)
            grpc_server.stop(settings.grace_s).wait()
            if endpoint is not None:
                endpoint.close()
            logging.getLogger(__name__).info("worker %s stopped", info.model_name)

        return lifecycle.Running(f"worker {info.model_name} listening on {settings.host}:{port}", close, work,
                                 metrics=prometheus.metrics_line(f"worker {info.model_name}", endpoint))

    return lifecycle.serve("specrouter-worker", open_worker)


def _reap(engine, stop: threading.Event) -> None:
    """Reclaims abandoned states between requests, not only when the next request arrives."""
    period = max(1.0, engine.settings.state_ttl_s / 10)
    while not stop.wait(period):
        expired = engine.reclaim_expired()
        if expired:
            logging.getLogger(__name__).info("reclaimed %d abandoned states", len(expired))


if __name__ == "__main__":
    sys.exit(main())
