"""Kernel tests run natively on CUDA and in Triton's interpreter everywhere else.

``TRITON_INTERPRET`` is read when ``@triton.jit`` runs, so it is set here, before any test
module imports the kernels.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
