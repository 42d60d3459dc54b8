"""The life cycle every service process shares: settings, logging, tracing, signals, the "listening" line,
an ordered shutdown.

`python -m specrouter.router|worker|profiler` each parse their settings and hand `serve` a function that
opens the service: it binds the port, starts serving and returns a `Running`. `serve` then
1. installs the SIGTERM / SIGINT handlers, before the line: a supervisor may stop the service as soon as
   it reads it;
2. prints the line, e.g. `router listening on HOST:PORT`, which the launcher and the tests wait for;
   before it, where the service serves its Prometheus metrics: `router metrics at http://HOST:PORT/metrics`;
3. runs the service's work on the main thread until a signal (most services just wait);
4. closes the service, then flushes the traces.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic_settings import BaseSettings

from specrouter import tracing

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
S = TypeVar("S", bound=BaseSettings)


def configure_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=LOG_FORMAT)


def settings_from_flags(settings_type: type[S], argv: Sequence[str] | None, prog: str, description: str | None,
                        convert: Mapping[str, Callable[[str], Any]] | None = None) -> S:
    """One flag per settings field (`--tokenizer-dir` sets `tokenizer_dir`). A flag given overrides the
    field's environment variable, which overrides the default; `convert` turns a flag's text into what
    the field takes where pydantic would not (a list, a nested object). Fields the settings class names in
    `env_only` (a secret: flags show in the process list) get no flag."""
    prefix = settings_type.model_config.get("env_prefix", "")
    env_only = getattr(settings_type, "env_only", frozenset())
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    for name in (n for n in settings_type.model_fields if n not in env_only):
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                            help=f"(env {prefix}{name.upper()})")
    for name in env_only:   # refused before argparse would echo the value in its error
        flag = "--" + name.replace("_", "-")
        if any(a == flag or a.startswith(flag + "=") for a in (sys.argv[1:] if argv is None else argv)):
            parser.error(f"{flag} is not a flag: a flag's value shows in the process list; set {prefix}{name.upper()}"
                         + (f" or --{name.replace('_', '-')}-file" if f"{name}_file" in settings_type.model_fields
                            else ""))
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    for name, parse in (convert or {}).items():
        if name in given:
            given[name] = parse(given[name])
    return settings_type(**given)


def _wait(stop: threading.Event) -> None:
    stop.wait()


@dataclass
class Running:
    """A service that serves: the line that says where, its main-thread work, and how it closes."""

    listening: str                                         # "<name> listening on HOST:PORT"
    close: Callable[[], None]                              # stops serving and releases what it opened, in order
    work: Callable[[threading.Event], None] = _wait        # runs until the event is set
    metrics: str = ""                                      # "<name> metrics at URL", printed before `listening`


def serve(service_name: str, open_service: Callable[[], Running]) -> int:
    """Runs one service process from tracing to shutdown; `service_name` is its default tracing name."""
    tracing.configure(service_name, os.environ)
    try:
        running = open_service()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if running.metrics:
            print(running.metrics, flush=True)
        print(running.listening, flush=True)
        try:
            running.work(stop)
        finally:
            running.close()
    finally:
        tracing.shutdown()
    return 0
