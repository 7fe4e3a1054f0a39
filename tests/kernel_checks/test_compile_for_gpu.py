"""The kernels compile for a Hopper GPU (sm_90) even where none is present.

The interpreter runs kernel bodies as numpy and accepts code the compiler rejects, and it is
switched on for this whole test package on CPU machines, so the compile runs in a child
process without it, using Triton's bundled ptxas.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPILE_CHECK = str(Path(__file__).with_name("compile_check.py"))


def test_every_kernel_variant_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, COMPILE_CHECK, "--arch", "90"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 * (3 + 2) + 3
    assert all(line.startswith("ok ") for line in lines), result.stdout


def test_compile_check_refuses_to_run_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, COMPILE_CHECK],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "unset TRITON_INTERPRET" in result.stderr
