"""Loading a pool: its manifest, its models through transformers' Auto classes, one shared tokenizer."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specrouter.pool.manifest import PoolError, PoolManifest

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise PoolError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}") from None


def tokenizer_fingerprint(model_dir: Path) -> str:
    """SHA-256 of the tokenizer's vocabulary, merges and special tokens: equal iff two models share it."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        raise PoolError(f"{model_dir} has no tokenizer.json; every pool model needs its (shared) fast tokenizer")
    data = json.loads(path.read_text())
    model = data.get("model", {})
    canonical = {"type": model.get("type"), "vocab": model.get("vocab"), "merges": model.get("merges"),
                 "added": sorted((t["id"], t["content"]) for t in data.get("added_tokens", []))}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def load_model(model_dir: Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> PreTrainedModel:
    """The checkpoint's model, from safetensors weights only: a pickle file (`pytorch_model.bin`, `.pt`) can
    run code when it is loaded, so a directory without safetensors is refused; and no model code from
    the checkpoint runs (the Auto classes' built-in architectures only)."""
    if not (model_dir / "config.json").exists():
        raise PoolError(f"{model_dir} is not a Hugging Face checkpoint (no config.json)")
    if not any(model_dir.glob("*.safetensors")):
        pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        found = f" (it has {', '.join(pickles)}: pickle files, which are never loaded)" if pickles else ""
        raise PoolError(f"{model_dir} has no safetensors weights{found}; SpecRouter loads model.safetensors "
                        "only: convert the checkpoint, e.g. save_pretrained(..., safe_serialization=True)")
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, use_safetensors=True).to(device).eval()


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(model_dir)


@dataclass(frozen=True)
class PoolDir:
    """A pool directory, checked: the manifest parses and every model shares the target's tokenizer."""

    directory: Path
    manifest: PoolManifest

    @classmethod
    def open(cls, directory: Path) -> PoolDir:
        directory = Path(directory)
        manifest = PoolManifest.load(directory)
        pool = cls(directory, manifest)
        target_fp = tokenizer_fingerprint(pool.model_dir(manifest.target))
        differ = [m.name for m in manifest.members if tokenizer_fingerprint(pool.model_dir(m.name)) != target_fp]
        if differ:
            raise PoolError(f"models {differ} do not share the target {manifest.target!r}'s tokenizer; "
                            "every model of a pool must use the same tokenizer")
        return pool

    @property
    def target(self) -> str:
        return self.manifest.target

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.manifest.members]

    def model_dir(self, name: str) -> Path:
        return self.manifest.model_dir(self.directory, name)
