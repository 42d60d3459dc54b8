"""`python -m specrouter.router --workers HOST:PORT,... --tokenizer-dir DIR [--port N] ...`, or
`python -m specrouter.router --models-in-process true --pool-dir DIR --tokenizer-dir DIR ...` to serve the pool's
models in the router's own process."""

from __future__ import annotations

import json
import logging
import sys

from pydantic import ValidationError

from specrouter import lifecycle, prometheus
from specrouter.pool.manifest import PoolError
from specrouter.router.auth import load_token, upstream_tls
from specrouter.router.settings import RouterSettings
from specrouter.tls import CredentialsError, server_tls


def parse_settings(argv: list[str] | None) -> RouterSettings:
    return lifecycle.settings_from_flags(RouterSettings, argv, prog="specrouter serve router", description=__doc__,
                                         convert={"workers": lambda s: [w for w in s.split(",") if w],
                                                  "scheduler": json.loads})


def main(argv: list[str] | None = None) -> int:
    lifecycle.configure_logging()
    try:
        settings = parse_settings(argv)
    except ValidationError as exc:   # a limit that contradicts another, a value out of range
        print(f"router: invalid settings: {exc}", file=sys.stderr)
        return 2
    try:   # the files are read before anything starts: a missing one stops the router here
        tls, upstream, token = server_tls(settings), upstream_tls(settings), load_token(settings)
    except CredentialsError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    from specrouter.router import server as srv

    def open_router() -> lifecycle.Running:
        compute = None
        if settings.models_in_process:   # the models' calls run on this thread, which loads them (models_in_process.py)
            from specrouter.models_in_process import ComputeLoop, pool_workers
            from specrouter.router.replicas import ReplicaSet

            compute = ComputeLoop()
            replicas = ReplicaSet.fixed(pool_workers(settings.pool_dir, compute, settings.models_dtype,
                                                     settings.models_device, say=logging.getLogger(__name__).info))
        else:
            replicas = srv.connect_workers(settings, upstream)
        router = srv.Router(settings, replicas, upstream)
        router.start()
        grpc_server, port, _ = srv.create_server(settings, router, tls, token)
        grpc_server.start()
        metrics = prometheus.serve_metrics(router.prometheus.registry, settings.host, settings.metrics_port)

        def close() -> None:
            grpc_server.stop(settings.grace_s).wait()
            router.close()
            if metrics is not None:
                metrics.close()

        return lifecycle.Running(f"router listening on {settings.host}:{port}", close,
                                 **({"work": lambda stop: compute.run(until=stop)} if compute else {}),
                                 metrics=prometheus.metrics_line("router", metrics))

    try:
        return lifecycle.serve("specrouter-router", open_router)
    except (srv.PoolMismatch, PoolError) as exc:   # workers that disagree; a pool directory that is not one
        print(f"router: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
