"""Waiting, in a test, for what happens on another thread or in another process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(check: Callable[[], Any], timeout_s: float = 30.0, step_s: float = 0.02) -> Any:
    """Poll ``check`` until it returns something truthy (returned); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s: {check}")
        time.sleep(step_s)
