"""Benchmarks and the soak run, beside the product (never shipped in its wheel): run each with
``python -m bench.<name>`` from the checkout (``make bench``, ``make bench-engine``, ...).

They drive the tests' own fixtures (the fake upstream, scratch PostgreSQL, tiny checkpoints,
``switchyard serve`` as a child process), which import one another by name from
``tests/support``: that folder goes on the import path here, as pytest puts it there for the
tests (``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import sys
from pathlib import Path

SUPPORT = str(Path(__file__).resolve().parents[1] / "tests" / "support")
if SUPPORT not in sys.path:
    sys.path.append(SUPPORT)
