"""The bench's rows that run in its own process: transformers peers and SpecRouter's own engine.

Both take the token ids the router would decode and return each prompt's new token ids, greedy, stopping
as the router stops, so that their outputs compare with the services' token for token:

- `peer`: a transformers peer (`report.peers`): target-only `generate` one prompt at a time or, at batch
  B > 1, batched in waves of B; assisted generation with a drafter and prompt lookup, one at a time;
- `engine`: the router's chain step (`ChainBatch`) over the pool's worker engines in this process
  (`InProcessPool`), for one static chain and window, in waves of B rows in one `ChainBatch` (B = 1: one
  prompt at a time; a wave ends with its longest row, where the services' B clients each send their next
  request as one returns). It is what the services run for that chain and window less gRPC, the router's
  batcher, the client and the processes between them, so the services' speed over it is what they keep
  of the engine. The lookup chain has no engine row: the router's lookup level also copies from the rows
  it ran before, which a fresh batch in process has not seen, so the two would not propose alike.

The engines drive the same loaded models as the peers (the pool is held in memory once), with the
workers' default engine settings, and are warmed up as a worker warms up at start (every forward shape of
its default profile grid), so that neither side pays first-call costs in the measured rounds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specrouter.inprocess import InProcessPool
from specrouter.pool.load import PoolDir
from specrouter.report import peers as hf
from specrouter.report.bench_results import HF_PROMPT_LOOKUP, HF_TARGET
from specrouter.v1 import worker_pb2 as pb
from specrouter.contract.calls import SamplingParams
from specrouter.worker.server import warm_up
from specrouter.worker.settings import WorkerSettings

WARMUP_TOKENS = 4          # the warm-up generations, once per model and mode
GREEDY = SamplingParams()


@dataclass
class Run:
    """One configuration over a list of prompts: tokens, wall seconds, token ids and the services' stats."""

    tokens: int
    seconds: float
    outputs: list[list[int]]
    stats: list[tuple[object, int]] = field(default_factory=list)   # (GenerationStats, client wall ns)


def waves(ids: Sequence[list[int]], batch: int) -> list[Sequence[list[int]]]:
    """The prompts in order, `batch` at a time (the last wave may be shorter)."""
    return [ids[i:i + batch] for i in range(0, len(ids), batch)]


@dataclass
class InProcessRows:
    """The pool's models in this process, as transformers peers and as the engines of the chain step."""

    peers: hf.PeerModels
    pool: InProcessPool
    max_new_tokens: int

    @classmethod
    def load(cls, pool_dir: Path, device: str, dtype: str, max_new_tokens: int) -> InProcessRows:
        peers = hf.PeerModels.load(pool_dir, device, dtype)
        return cls(peers, InProcessPool(PoolDir.open(pool_dir), models=peers.models), max_new_tokens)

    def peer(self, label: str, ids: Sequence[list[int]], batch: int) -> Run:
        """A transformers peer over the prompts: one at a time, or in waves of `batch` when batched."""
        n, peers = self.max_new_tokens, self.peers
        started = time.perf_counter()
        if label == HF_TARGET and batch > 1:
            outputs = [o for wave in waves(ids, batch) for o in hf.generate_batched(peers, wave, n)]
        elif label == HF_TARGET:
            outputs = [hf.generate_target(peers, p, n) for p in ids]
        elif label == HF_PROMPT_LOOKUP:
            outputs = [hf.generate_prompt_lookup(peers, p, n) for p in ids]
        else:
            drafter = label.split(":", 1)[1]
            outputs = [hf.generate_assisted(peers, drafter, p, n) for p in ids]
        return _run(outputs, started)

    def engine(self, chain: Sequence[str], window: int, ids: Sequence[list[int]], batch: int) -> Run:
        """The chain step over the engines at `chain` and `window`, greedy, the prompts in waves of `batch`
        rows in one `ChainBatch` each."""
        started = time.perf_counter()
        outputs = [row.generated for wave in waves(ids, batch) for row in self.pool.generate_ids(
            wave, chain, window, [GREEDY] * len(wave), self.max_new_tokens)]
        return _run(outputs, started)

    def warm(self, ids: list[int], drafters: Sequence[str]) -> None:
        """One short generation per model and mode: the first call of each pays for allocations."""
        peers, pair = self.peers, [ids, ids[1:] or ids]
        hf.generate_target(peers, ids, WARMUP_TOKENS)
        hf.generate_batched(peers, pair, WARMUP_TOKENS)
        for d in drafters:
            hf.generate_assisted(peers, d, ids, WARMUP_TOKENS)
        hf.generate_prompt_lookup(peers, ids, WARMUP_TOKENS)
        grid = WorkerSettings.model_fields
        for engine in self.pool.engines.values():   # as a worker does before it serves
            warm_up(engine, pb.InfoResponse(), grid["profile_batch_sizes"].default,
                    grid["profile_tokens_per_row"].default)
        # the chain step itself: target-only, then every engine drafting or verifying; at batch 1 and 2
        for chain, window in (((peers.target,), 0), ((*drafters, peers.target), 2))[: 1 + bool(drafters)]:
            self.pool.generate_ids(pair, chain, window, [GREEDY] * 2, WARMUP_TOKENS)
            self.pool.generate_ids(pair[:1], chain, window, [GREEDY], WARMUP_TOKENS)


def _run(outputs: list[list[int]], started: float) -> Run:
    return Run(sum(len(o) for o in outputs), time.perf_counter() - started, outputs)
