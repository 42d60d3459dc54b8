"""The training corpus: the Python standard library's own source, split into train and held-out by file."""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_ONE_IN = 25  # one file in 25 (by a hash of its path) is held out


@dataclass(frozen=True)
class CorpusFile:
    relpath: str
    text: str

    @property
    def heldout(self) -> bool:
        digest = hashlib.sha1(self.relpath.encode()).digest()
        return int.from_bytes(digest[:4], "big") % HELDOUT_ONE_IN == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[CorpusFile]:
    """Every `.py` file of the standard library (site-packages excluded), sorted by path."""
    root = root or stdlib_root()
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if "site-packages" in rel.parts or "dist-packages" in rel.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            files.append(CorpusFile(rel.as_posix(), text))
    return files


def split(files: list[CorpusFile]) -> tuple[list[CorpusFile], list[CorpusFile]]:
    train = [f for f in files if not f.heldout]
    heldout = [f for f in files if f.heldout]
    return train, heldout
