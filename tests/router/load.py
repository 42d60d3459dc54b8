"""Other clients' requests in the background of a test: sampled requests that join and leave the batches."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures


@contextlib.contextmanager
def other_requests(client, prompts: Sequence[str], loaders: int, min_tokens: int, token_spread: int) -> Iterator[None]:
    """While the block runs, `loaders` threads each send `prompts` in turn, seeded sampled requests of
    `min_tokens` to `min_tokens + token_spread - 1` new tokens, so rows of every length join and leave the
    batches the block's own requests run in. Their errors are raised when the block ends."""
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            client.generate(prompts[i % len(prompts)], max_new_tokens=min_tokens + i % token_spread,
                            temperature=0.9, seed=i)
            i += 1

    with futures.ThreadPoolExecutor(loaders) as pool:
        running = [pool.submit(load) for _ in range(loaders)]
        try:
            yield
        finally:
            stop.set()
            for f in running:
                f.result()
