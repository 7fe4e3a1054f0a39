"""Every example in README.md and docs/ runs against the shipped policy.

Each ```sh block and each ```python block of a page is run, in the page's order, against a
gateway serving the shipped routing_rules.yaml in which only the providers' base URLs point at
a loopback OpenAI-compatible upstream (every shipped remote provider speaks that format) with
the provider keys set, and the local provider's checkpoint is the tiny test one (fast to load;
the bundled model's answers are checked in tests/providers/test_providers_local_readme.py).
A page's sh blocks run as one bash session (``set -euo pipefail``, and curl fails on an HTTP
error, showing the body); its python blocks in one namespace, as a reader pasting them in order.
The placeholders: ``127.0.0.1:8080``/``localhost:8080`` become the gateway's address,
``sk-sy-...`` and ``$KEY`` an API key, ``$ID`` the id of another key (one the examples
manage: rotate, revoke), ``$ADMIN`` and ``var/admin_key`` the admin key, fresh keys for each
page; the working directory holds ``routing_rules.yaml`` (the test policy) and
``new_rules.yaml``.

A block that cannot run here (a make target, a pip install, an API outline) carries
``<!-- not-run: reason -->`` on the line before it; the list of them is printed and kept short.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(sh|python)\n(.*?)^```", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not-run: (.+?) -->\s*$")
# At most this many blocks are excluded; each one says why.
MAX_NOT_RUN = 12


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    not_run: str | None


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        found.append(
            Block(page, line, match.group(1), match.group(2), marker.group(1) if marker else None)
        )
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
RUN_PAGES = sorted(
    {b.page for b in ALL_BLOCKS if b.not_run is None}, key=lambda p: str(p.relative_to(ROOT))
)


def test_exclusions_are_few_and_say_why() -> None:
    excluded = [b for b in ALL_BLOCKS if b.not_run is not None]
    for block in excluded:
        print(f"not run: {block.page.relative_to(ROOT)}:{block.line}: {block.not_run}")
        assert len(block.not_run.strip()) >= 10, "a not-run marker needs its reason"
    assert len(excluded) <= MAX_NOT_RUN
    markers = sum(page.read_text().count("<!-- not-run:") for page in PAGES)
    assert markers == len(excluded), "a not-run marker that is not right before a block"


@dataclass
class DocsGateway:
    gateway: Any  # gateway_runner.RunningGateway
    workdir: Path
    env: dict[str, str]
    key: str = ""

    def for_page(self, page: Path) -> DocsGateway:
        """This gateway with an API key and a managed key of the page's own."""
        managed_id, _ = self.gateway.create_key(name=f"docs-managed-{page.stem}")
        _, key = self.gateway.create_key(name=f"docs-{page.stem}")
        env = {**self.env, "ID": managed_id, "KEY": key}
        return DocsGateway(self.gateway, self.workdir, env, key)


def docs_policy(upstream_url: str, checkpoint: Path) -> dict[str, Any]:
    """The shipped policy with only base URLs (and the local checkpoint) replaced."""
    policy = yaml.safe_load((ROOT / "routing_rules.yaml").read_text())
    for provider in policy["providers"].values():
        if "base_url" in provider:
            provider["base_url"] = upstream_url
        if provider.get("kind") == "local":
            provider["engine"].update(
                model=str(checkpoint),
                device="cpu",
                max_num_seqs=4,
                kv_cache_bytes=64 * 1024 * 1024,
            )
    return policy


@pytest.fixture(scope="module")
def docs_gateway(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[DocsGateway]:
    pytest.importorskip("torch")
    from gateway_runner import PEPPER, GatewayThread, make_settings
    from native_openai import FakeOpenAI
    from native_upstreams import NativeFleet
    from tiny_checkpoint import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("docs")
    checkpoint = write_tiny_checkpoint(root / "tiny", arch="qwen3")
    upstream_key = "sk-upstream-docs-0123456789"
    fleet = NativeFleet(FakeOpenAI("openai", upstream_key))
    with pytest.MonkeyPatch.context() as env, fleet:
        policy = docs_policy(fleet["openai"].url, checkpoint)
        for provider in policy["providers"].values():
            if provider.get("api_key_env"):
                env.setenv(provider["api_key_env"], upstream_key)
        workdir = root / "work"
        (workdir / "var").mkdir(parents=True)
        policy_file = workdir / "routing_rules.yaml"
        policy_file.write_text(yaml.safe_dump(policy, sort_keys=False))
        shutil.copy(policy_file, workdir / "new_rules.yaml")
        data_dir = root / "data"
        settings = make_settings(
            data_dir, policy_file, redis_url, upstream_read_timeout_s=60.0, max_body_bytes=1 << 20
        )
        with GatewayThread(settings, start_timeout_s=120) as gateway:
            (workdir / "var" / "admin_key").write_text(gateway.admin_key + "\n")
            shell_env = {
                **os.environ,
                "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                "PYTHONPATH": str(ROOT),
                "SWITCHYARD_REDIS_URL": redis_url,
                "SWITCHYARD_DATA_DIR": str(data_dir),
                "SWITCHYARD_KEY_PEPPER": PEPPER,
                "SWITCHYARD_ADMIN_KEY": gateway.admin_key,
                "SWITCHYARD_PORT": str(gateway.port),
                "ADMIN": gateway.admin_key,
            }
            yield DocsGateway(gateway, workdir, shell_env)


def substituted(code: str, docs: DocsGateway) -> str:
    address = docs.gateway.base_url.removeprefix("http://")
    code = code.replace("127.0.0.1:8080", address).replace("localhost:8080", address)
    return code.replace("sk-sy-...", docs.key)


# What a block must never do here: it installs, builds or starts something of its own.
UNSAFE = re.compile(r"\b(pip install|make |kubectl|docker|git archive|switchyard serve)")

CURL_FAILS = 'curl() { command curl --fail-with-body --show-error "$@"; }\n'


def run_shell(page_blocks: list[Block], docs: DocsGateway) -> None:
    script = ["set -euo pipefail", CURL_FAILS]
    for block in page_blocks:
        where = f"{block.page.relative_to(ROOT)}:{block.line}"
        unsafe = UNSAFE.search(block.code)
        assert unsafe is None, f"{where}: {unsafe.group(0)!r}: mark the block <!-- not-run: why -->"
        script.append(f"echo '>>> {where}' >&2")
        script.append(substituted(block.code, docs))
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=docs.workdir,
        env=docs.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n--- stdout ---\n{done.stdout[-2000:]}"


def run_python(page_blocks: list[Block], docs: DocsGateway) -> None:
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    for block in page_blocks:
        where = f"{block.page.relative_to(ROOT)}:{block.line}"
        code = compile(substituted(block.code, docs), where, "exec")
        try:
            exec(code, namespace)  # the docs' own examples
        except Exception as exc:
            raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_examples_run(page: Path, docs_gateway: DocsGateway) -> None:
    docs = docs_gateway.for_page(page)
    runnable = [b for b in blocks(page) if b.not_run is None]
    shell = [b for b in runnable if b.language == "sh"]
    python = [b for b in runnable if b.language == "python"]
    if shell:
        run_shell(shell, docs)
    if python:
        run_python(python, docs)
