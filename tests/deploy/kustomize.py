"""Rendering k8s/ with `kubectl kustomize` and reading what it made: workloads, their pods' labels, the
environment a container gets, label selectors."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from tests.deploy.commands import REPO_ROOT

K8S = REPO_ROOT / "k8s"
OVERLAYS = ("local", "a100")


def kubectl() -> str:
    """kubectl's path. It comes with the machines this project runs on: a CI run without it fails; a
    machine of a person without it skips the tests that need it."""
    path = shutil.which("kubectl")
    if path is None:
        message = "kubectl is not installed: the Kubernetes manifests cannot be rendered"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def render(directory: Path) -> list[dict]:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def matches(selector: Mapping, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions) applied to `labels`."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def pod_labels(deployment: dict) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def component(deployment: dict) -> str:
    return pod_labels(deployment).get("app.kubernetes.io/component", "")


def container_env(container: dict, objects: list[dict]) -> dict[str, str]:
    """The environment the container gets, ConfigMap and Secret references resolved."""
    config_maps, secrets = by_kind(objects, "ConfigMap"), by_kind(objects, "Secret")

    def secret_data(name: str) -> dict[str, str]:
        secret = secrets[name]
        return {**{k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()},
                **(secret.get("stringData") or {})}

    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(config_maps[source["configMapRef"]["name"]]["data"])
        else:
            env.update(secret_data(source["secretRef"]["name"]))
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["configMapKeyRef"]
            env[var["name"]] = config_maps[ref["name"]]["data"][ref["key"]]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secret_data(ref["name"])[ref["key"]]
    return env


def relative_overlay(tmp_path: Path, kustomization: dict) -> Path:
    """A kustomization in `tmp_path` that may name k8s/ directories as `{k8s}/...` (kustomize takes only
    relative paths)."""
    k8s = os.path.relpath(K8S, tmp_path)
    text = yaml.safe_dump(kustomization).replace("{k8s}", k8s)
    (tmp_path / "kustomization.yaml").write_text(text)
    return tmp_path


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())
