"""What the bench's tests share: cells of made-up speeds, a Bench whose runs are synthetic (no cluster, no
models), a progress that counts, and a pool of tiny random Llamas saved to disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specrouter.pool.manifest import PoolManifest, PoolMember
from specrouter.report.bench import Bench, BenchSettings, ModelRow, Run, ServiceConfig
from specrouter.report.bench_results import (ENGINE, HF_TARGET, IN_PROCESS, SERVICES, Cell, Entry,
                                             Screened, Spread)
from tests.conftest import DEMO_POOL

# -- cells of made-up speeds ----------------------------------------------------------------------


def entry(label: str, tps: float, path: str = SERVICES) -> Entry:
    """A configuration whose rounds measured 5% either side of `tps`."""
    return Entry(label, path, None, 0, Spread.of([tps * 0.95, tps, tps * 1.05]))


def path_of(label: str) -> str:
    """The path a label runs on: transformers (`hf...`), the engine (`engine:...`) or the services."""
    return IN_PROCESS if label.startswith("hf") else ENGINE if label.startswith(f"{ENGINE}:") else SERVICES


def made_up_cell(kind: str, batch: int, speeds: dict[str, float]) -> Cell:
    """A cell of the given medians by label, each on the path its label names."""
    entries = [entry(label, v, path_of(label)) for label, v in speeds.items()]
    return Cell(kind, batch, 8, HF_TARGET, entries, [Screened(["d", "t"], 2, 1.0)])


# -- a Bench whose runs are synthetic -------------------------------------------------------------

SERVICES_SPEED = {("s", "t", 2): 30.0, ("s", "t", 3): 40.0, ("m", "t", 2): 50.0, ("m", "t", 3): 20.0}
ENGINE_SPEED = 40.0


def outputs(n: int, wrong: bool) -> list[list[int]]:
    """Prompt i gives `[i] * 3`; a wrong run gives another token for prompt 1."""
    out = [[i] * 3 for i in range(n)]
    if wrong:
        out[1] = [1, 9, 1]
    return out


class FakeLocal:
    """The in-process rows, synthetic: a peer takes a second a run, the engine runs at ENGINE_SPEED; both
    give every prompt's `outputs`, the engine a wrong one at the (chain, window) `wrong`."""

    def __init__(self, calls: list, wrong: tuple[tuple[str, ...], int] | None = None):
        self.calls, self.wrong = calls, wrong

    def peer(self, label, ids, batch):
        self.calls.append(label)
        return Run(len(ids) * 3, 1.0, outputs(len(ids), False))

    def engine(self, chain, window, ids, batch):
        self.calls.append((ENGINE, tuple(chain), window, batch))
        return Run(len(ids) * 3, len(ids) * 3 / ENGINE_SPEED, outputs(len(ids), (tuple(chain), window) == self.wrong))


class FakeBench(Bench):
    """A Bench whose runs are synthetic: every run of a prompt gives `[prompt index] * 3`, except that the
    services configuration `wrong` (and the engine at `wrong_engine`) gives a different token for prompt 1."""

    def __init__(self, wrong: ServiceConfig | None = None, wrong_engine: tuple[tuple[str, ...], int] | None = None,
                 batch_sizes: tuple[int, ...] = (1,)):   # no client, no models
        self.settings = BenchSettings(kinds=("code",), batch_sizes=batch_sizes, requests=2, rounds=2, windows=(2, 3))
        self.models = [ModelRow("s", 1, "drafter"), ModelRow("m", 5, "drafter"), ModelRow("t", 29, "target")]
        self.target, self.drafters, self.lookup = "t", ["s", "m"], "lookup"
        self.wrong, self.calls = wrong, []
        self.local = FakeLocal(self.calls, wrong_engine)
        self.progress = CountingProgress()

    def services(self, config, prompts, batch):
        self.calls.append(config)
        seconds = len(prompts) * 3 / SERVICES_SPEED.get((*(config.chain or ()), config.window), 10.0)
        return Run(len(prompts) * 3, seconds, outputs(len(prompts), config == self.wrong),
                   [(SimpleNamespace(cycles=1), 0) for _ in prompts])


class CountingProgress:
    def __init__(self):
        self.total = self.done = 0

    def start(self, total):
        self.total = total

    def advance(self, waves, description):
        self.done += waves

    def lower_total(self, waves):
        self.total -= waves


# -- a pool of tiny random Llamas -----------------------------------------------------------------

TINY_HIDDEN, TINY_LAYERS, SHARPNESS = 32, 2, 8.0


def tiny_model(seed: int, vocab: int, layers: int = TINY_LAYERS) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=TINY_HIDDEN, intermediate_size=2 * TINY_HIDDEN,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                         pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(SHARPNESS)   # peaked next-token distributions: no near ties to flip
    return model


def save_tiny_pool(root: Path) -> Path:
    """A two-model pool (target `t`, drafter `d`) of tiny random Llamas (a few hundred K parameters) with
    the demo pool's tokenizer, at `root`."""
    vocab = json.loads((DEMO_POOL / "stdlib-29m" / "config.json").read_text())["vocab_size"]
    for name, seed, layers in (("t", 1, 2), ("d", 2, 1)):
        tiny_model(seed, vocab, layers).save_pretrained(root / name)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(DEMO_POOL / "stdlib-29m" / f, root / name / f)
    PoolManifest("t", [PoolMember("t", "t"), PoolMember("d", "d")]).save(root)
    return root
