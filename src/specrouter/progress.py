"""Progress for long work: a live bar on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

log = logging.getLogger("specrouter.progress")
LOG_EVERY_S = 30.0

ProgressFn = Callable[[int, int, float], None]  # (done, total, loss)


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[ProgressFn]:
    if sys.stderr.isatty():
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn()]
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task(description, total=total, loss=float("nan"))
            yield lambda done, _total, loss: bar.update(task, completed=done, loss=loss)
        return
    start = time.perf_counter()
    last = [start]

    def report(done: int, total_: int, loss: float) -> None:
        now = time.perf_counter()
        if now - last[0] >= LOG_EVERY_S or done == total_:
            last[0] = now
            eta = (now - start) / done * (total_ - done)
            log.info("%s: %d/%d loss %.3f, %.0f s left", description, done, total_, loss, eta)

    yield report
