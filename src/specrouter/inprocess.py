"""The whole pool in one process: workers as engines, the chain runner driving them as the router would.

Used by `specrouter generate --in-process`, by the benchmarks and by the tests; the services drive the
same `ChainBatch` over gRPC.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specrouter.pool.load import PoolDir, load_model, load_tokenizer
from specrouter.router.chain import ChainBatch, run_to_completion, workers_of_chain
from specrouter.router.cycle_report import CycleReport
from specrouter.router.row import Row
from specrouter.router.lookup import LOOKUP, LookupProposer
from specrouter.router.stops import StopStrings
from specrouter.contract.calls import SamplingParams
from specrouter.worker.engine import EngineSettings, WorkerEngine
from specrouter.worker.forward import ModelForward


@dataclass
class Generation:
    prompt: str
    text: str
    token_ids: list[int]
    finish_reason: str
    cycles: int = 0
    chain_counts: Counter = field(default_factory=Counter)       # chain name -> cycles
    accepted_per_level: dict[str, float] = field(default_factory=dict)  # mean accepted proposal tokens
    seconds: float = 0.0


def chain_name(chain: Sequence[str]) -> str:
    return ",".join(chain)


class InProcessPool:
    def __init__(self, pool: PoolDir, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 settings: EngineSettings = EngineSettings(), models: Mapping[str, PreTrainedModel] | None = None):
        """`models`: the pool's models already loaded (by name), which the engines then drive instead of
        loading their own (`dtype` and `device` are theirs): a caller that also runs them with transformers
        holds the pool in memory once. The engines only read the weights."""
        self.pool = pool
        self.target = pool.target
        self.tokenizer = load_tokenizer(pool.model_dir(pool.target))
        loaded = models if models is not None else {n: load_model(pool.model_dir(n), dtype, device) for n in pool.names}
        self.engines: dict[str, WorkerEngine] = {
            name: WorkerEngine(name, ModelForward(loaded[name]), settings) for name in pool.names
        }
        self.context_length = min(e.forward.context_length for e in self.engines.values())
        self.parameters = {n: e.info.parameters for n, e in self.engines.items()}

    @classmethod
    def open(cls, directory: Path, **kwargs) -> InProcessPool:
        return cls(PoolDir.open(directory), **kwargs)

    def by_size(self) -> list[str]:
        """Model names, smallest first."""
        return sorted(self.engines, key=self.parameters.__getitem__)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate_ids(self, prompts: Sequence[Sequence[int]], chain: Sequence[str], window: int,
                     params: Sequence[SamplingParams], max_new_tokens: int,
                     on_cycle=None, stop: Sequence[str] = ()) -> list[Row]:
        batch = ChainBatch(workers_of_chain(chain, {**self.engines, LOOKUP: LookupProposer()}), self.target,
                           self.context_length)
        eos = self.tokenizer.eos_token_id
        stops = frozenset() if eos is None else frozenset({eos})
        strings = StopStrings(stop, self.tokenizer.decode) if stop else None
        rows = [Row(f"{i}-{uuid.uuid4().hex[:8]}", list(p), len(p), sp, max_new_tokens, stops, strings)
                for i, (p, sp) in enumerate(zip(prompts, params))]
        batch.add(rows)
        try:
            done = run_to_completion(batch, lambda _: (chain, window), on_cycle)
        finally:
            batch.release()
        return [done[r.row_id] for r in rows]

    def generate(self, prompts: Sequence[str], chain: Sequence[str], window: int, params: SamplingParams,
                 max_new_tokens: int, on_cycle=None, stop: Sequence[str] = ()) -> list[Generation]:
        ids = [self.encode(p) for p in prompts]
        if any(not i for i in ids):
            raise ValueError("empty prompt: give at least one character of text")
        stats: list[CycleReport] = []

        def record(report: CycleReport) -> None:
            stats.append(report)
            if on_cycle is not None:
                on_cycle(report)

        start = time.perf_counter()
        rows = self.generate_ids(ids, chain, window, [params] * len(ids), max_new_tokens, record, stop)
        seconds = time.perf_counter() - start
        chain_counts = Counter(chain_name(r.chain) for r in stats)
        out = []
        for prompt, row in zip(prompts, rows):
            accepted = {}
            for level in chain[1:]:
                vals = [a for r in stats for a in r.accepted.get(level, [])]
                accepted[level] = sum(vals) / len(vals) if vals else 0.0
            out.append(Generation(prompt=prompt, text=self.tokenizer.decode(row.generated), token_ids=row.generated,
                                  finish_reason=row.finish_reason or "", cycles=row.cycle,
                                  chain_counts=chain_counts, accepted_per_level=accepted, seconds=seconds))
        return out
