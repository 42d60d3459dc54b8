"""`python -m specrouter.router --workers HOST:PORT,... --tokenizer-dir DIR [--port N] ...`"""

from __future__ import annotations

import json
import sys

from pydantic import ValidationError

from specrouter import lifecycle, prometheus
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
        router = srv.Router(settings, srv.connect_workers(settings, upstream), upstream)
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
                                 metrics=prometheus.metrics_line("router", metrics))

    try:
        return lifecycle.serve("specrouter-router", open_router)
    except srv.PoolMismatch as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
