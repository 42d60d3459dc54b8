"""`python -m specrouter.router --workers HOST:PORT,... --tokenizer-dir DIR [--port N] ...`"""

from __future__ import annotations

import argparse
import json
import os
import logging
import signal
import sys
import threading

from specrouter.router.settings import RouterSettings


def parse_settings(argv: list[str] | None) -> RouterSettings:
    ap = argparse.ArgumentParser(prog="specrouter serve router", description=__doc__)
    for name in RouterSettings.model_fields:
        ap.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                        help=f"(env SPECROUTER_ROUTER_{name.upper()})")
    given = {k: v for k, v in vars(ap.parse_args(argv)).items() if v is not None}
    if "workers" in given:
        given["workers"] = [w for w in given["workers"].split(",") if w]
    if "scheduler" in given:
        given["scheduler"] = json.loads(given["scheduler"])
    return RouterSettings(**given)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from specrouter.router import server as srv

    settings = parse_settings(argv)
    from specrouter import tracing

    tracing.configure("specrouter-router", os.environ)
    try:
        router = srv.Router(settings, srv.connect_workers(settings))
    except srv.PoolMismatch as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    router.batcher.start()
    grpc_server, port, _ = srv.create_server(settings, router)
    grpc_server.start()
    # handlers before the "listening" line: a supervisor may stop the router as soon as it reads it
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"router listening on {settings.host}:{port}", flush=True)
    stop.wait()
    grpc_server.stop(settings.grace_s).wait()
    router.batcher.stop()
    router.scheduler.close()
    router.reporter.close()
    router.metrics.close()
    tracing.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
