"""Runs the profiler: `python -m specrouter.profiler [--port N] [--redis-url URL] ...`.

Flags override SPECROUTER_PROFILER_* environment variables, which override the defaults.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from grpc_health.v1 import health
from pydantic import ValidationError

from specrouter import lifecycle, prometheus
from specrouter.profiler.prometheus import ProfilerMetrics
from specrouter.tls import CredentialsError, server_tls
from specrouter.profiler.server import create_server, shutdown
from specrouter.profiler.settings import ProfilerSettings
from specrouter.profiler.store import open_store

log = logging.getLogger("specrouter.profiler")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specrouter.profiler", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, help="port to listen on (0: a free one)")
    parser.add_argument("--host", help="address to bind")
    parser.add_argument("--redis-url", help="Redis URL; without one the metrics stay in this process")
    parser.add_argument("--ema-alpha", type=float,
                        help="weight of the newest report in the latency and similarity EMAs")
    parser.add_argument("--acceptance-alpha", type=float, help="weight of the newest check in the acceptance EMAs")
    parser.add_argument("--key-prefix", help="prefix of the Redis keys")
    parser.add_argument("--tls-cert", help="the profiler's TLS certificate chain (PEM); TLS needs --tls-client-ca")
    parser.add_argument("--tls-key", help="the private key of --tls-cert (PEM)")
    parser.add_argument("--tls-client-ca", help="the CA of the routers' client certificates (mutual TLS)")
    parser.add_argument("--metrics-port", type=int,
                        help="port of the Prometheus /metrics endpoint (0: a free one; -1: none)")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    lifecycle.configure_logging(verbose=args.verbose)
    try:   # the TLS files are read before the profiler starts: a missing one stops it here
        settings = ProfilerSettings(**{k: v for k, v in vars(args).items() if k != "verbose" and v is not None})
        tls = server_tls(settings, mutual_only=True)
    except (ValidationError, CredentialsError) as exc:
        print(f"profiler: {exc}", file=sys.stderr)
        return 2

    def open_profiler() -> lifecycle.Running:
        store = open_store(settings)
        health_servicer = health.HealthServicer()
        exported = ProfilerMetrics()
        server, port = create_server(settings, store, health_servicer, tls, exported)
        server.start()
        endpoint = prometheus.serve_metrics(exported.registry, settings.host, settings.metrics_port)
        log.info("metrics %s, ema_alpha %g, acceptance_alpha %g",
                 "in memory" if settings.redis_url is None else f"in Redis under {settings.key_prefix!r}",
                 settings.ema_alpha, settings.acceptance_alpha)

        def close() -> None:
            log.info("shutting down (grace %.1f s)", settings.grace_s)
            shutdown(server, health_servicer, settings.grace_s)
            store.close()
            if endpoint is not None:
                endpoint.close()

        return lifecycle.Running(f"profiler listening on {settings.host}:{port}", close,
                                 metrics=prometheus.metrics_line("profiler", endpoint))

    return lifecycle.serve("specrouter-profiler", open_profiler)


if __name__ == "__main__":
    sys.exit(main())
