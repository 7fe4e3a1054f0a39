"""The engine's front: ``engine/__init__.py`` exports its public surface, each name imported on
first use, and the gateway imports the engine through it only."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import engine

REPO = Path(__file__).resolve().parents[2]


def test_every_exported_name_resolves_to_its_definition():
    for name in engine.__all__:
        value = getattr(engine, name)
        home = importlib.import_module(engine._HOMES[name])
        assert value is getattr(home, name), name
    assert set(engine._HOMES) == set(engine.__all__)
    assert set(engine.__all__) <= set(dir(engine))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LLMEngin'"):
        _ = engine.LLMEngin
    with pytest.raises(ImportError):
        from engine import AsyncLLMEngine  # noqa: F401


def test_the_torch_free_names_do_not_load_torch():
    """What the gateway reads while it parses a request for the local model, and the bundled
    model's path, work where torch is not installed; the engine itself needs it."""
    script = """
import sys
sys.modules["torch"] = None  # any `import torch` now fails
import engine
from engine import GrammarError, SamplingParams, SamplingParamsError, StructuredOutput
from engine import BUNDLED_SAMPLING, find_bundled_model
assert SamplingParams(temperature=0.5, max_tokens=3).max_tokens == 3
assert StructuredOutput.json_object() == StructuredOutput.json_object()
assert issubclass(GrammarError, ValueError) and issubclass(SamplingParamsError, ValueError)
assert "temperature" in BUNDLED_SAMPLING
try:
    engine.AsyncEngine
except ImportError:
    print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_gateway_imports_the_engine_through_its_front_only():
    reached = []
    for path in sorted((REPO / "gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                reached += [
                    f"{where} import {a.name}" for a in node.names if a.name.startswith("engine")
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engine"):
                if node.module != "engine":
                    reached.append(f"{where} from {node.module}")
                reached += [
                    f"{where} {alias.name} is not in engine.__all__"
                    for alias in node.names
                    if alias.name not in engine.__all__
                ]
    assert reached == []
