"""`pool.json`: which directories hold the pool's models and which of them is the target.

A pool is a directory; real checkpoints (TinyLlama-1.1B, Llama-2-7b, ...) are used the same way by
writing a `pool.json` whose paths point at them (relative to the pool directory or absolute).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

MANIFEST_NAME = "pool.json"


class PoolError(ValueError):
    """The pool directory or its manifest is not usable; the message says what to fix."""


@dataclass(frozen=True)
class PoolMember:
    name: str
    path: str  # relative to the pool directory, or absolute


@dataclass(frozen=True)
class PoolManifest:
    target: str
    members: list[PoolMember]

    def save(self, directory: Path) -> None:
        data = {"target": self.target, "members": [asdict(m) for m in self.members]}
        (directory / MANIFEST_NAME).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> PoolManifest:
        path = directory / MANIFEST_NAME
        if not path.exists():
            raise PoolError(f"{path} does not exist: a pool directory needs a {MANIFEST_NAME} naming its models")
        try:
            data = json.loads(path.read_text())
            members = [PoolMember(name=m["name"], path=m["path"]) for m in data["members"]]
            manifest = cls(target=data["target"], members=members)
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise PoolError(f"{path} is malformed ({exc!r}); expected "
                            '{"target": NAME, "members": [{"name": NAME, "path": DIR}, ...]}') from exc
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise PoolError(f"{path}: model names must be unique, got {names}")
        if manifest.target not in names:
            raise PoolError(f"{path}: target {manifest.target!r} is not one of the members {names}")
        return manifest

    def model_dir(self, directory: Path, name: str) -> Path:
        member = next((m for m in self.members if m.name == name), None)
        if member is None:
            raise PoolError(f"unknown model {name!r}; the pool has {[m.name for m in self.members]}")
        path = Path(member.path)
        return path if path.is_absolute() else directory / path
