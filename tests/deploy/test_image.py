"""The Dockerfile and its build context, read without a Docker engine: what the build copies is in the
context (as Docker's own .dockerignore rules select it), the context is small, the base is pinned, and
the image runs `specrouter` as a user other than root."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from docker.utils.build import exclude_paths   # the Docker SDK's implementation of .dockerignore

from tests.deploy.commands import REPO_ROOT

CONTEXT_LIMIT_BYTES = 100 * 2**20   # the demo pool is about 70 MB of it


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    return [(parts[0].upper(), parts[1] if len(parts) > 1 else "")
            for parts in (line.strip().split(None, 1) for line in text.splitlines() if line.strip())]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions(REPO_ROOT / "Dockerfile")


@pytest.fixture(scope="module")
def context() -> set[str]:
    patterns = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    return set(exclude_paths(str(REPO_ROOT), patterns))


def test_everything_the_build_copies_is_in_the_context(dockerfile, context):
    sources = [src for op, args in dockerfile if op == "COPY" and not args.startswith("--from")
               for src in shlex.split(args)[:-1]]
    assert sources, "the Dockerfile copies nothing"
    for src in sources:
        path = src.rstrip("/")
        assert path in context, f"COPY {src}: left out of the build context by .dockerignore"
        if (REPO_ROOT / path).is_dir():
            tracked = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / path).rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)}
            assert tracked <= context, f"COPY {src}: {sorted(tracked - context)[:5]} left out"


def test_the_context_is_small(context):
    for left_out in (".git", ".venv", "tests", "benchmarks", ".cache", "k8s", "docs"):
        assert not any(p == left_out or p.startswith(left_out + "/") for p in context), left_out
    size = sum((REPO_ROOT / p).stat().st_size for p in context if (REPO_ROOT / p).is_file())
    assert size < CONTEXT_LIMIT_BYTES, f"the build context is {size / 2**20:.0f} MiB"


def test_base_image_is_pinned_and_stages_are_two(dockerfile):
    args = dict(a.split("=", 1) for op, a in dockerfile if op == "ARG" and "=" in a)
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base), base
    stages = [a for op, a in dockerfile if op == "FROM"]
    assert stages == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE} AS runtime"]
    assert args["TORCH_VARIANT"] == "cpu"   # the slim default; GPU workers build with a CUDA variant


def test_the_image_runs_specrouter_as_a_user_other_than_root(dockerfile):
    runtime = dockerfile[[i for i, (op, _) in enumerate(dockerfile) if op == "FROM"][-1]:]
    [user] = [a for op, a in runtime if op == "USER"]
    uid = dict(a.split("=", 1) for op, a in runtime if op == "ARG" and "=" in a)["UID"]
    assert user == "${UID}:${UID}" and int(uid) > 0
    assert ("ENTRYPOINT", '["specrouter"]') in runtime   # compose and k8s give `serve SERVICE ...`
    [exposed] = [a for op, a in runtime if op == "EXPOSE"]
    assert set(exposed.split()) == {"50051", "50052", "50053", "8000", "9464"}
    assert ("COPY", "models/demo-pool /models/demo-pool") in runtime
