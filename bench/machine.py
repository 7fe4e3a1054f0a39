"""The machine a figure was measured on: every bench prints it beside its figures (the same
code has measured 2x apart on two CPUs of one machine kind)."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``lscpu``'s "Model name") and the cores this process may use."""
    name = ""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name or platform.processor() or platform.machine()}, {cores} cores"


def cpu_us_per_call(call: Callable[[], object], calls: int, rounds: int = 7) -> float:
    """The CPU time of one ``call`` in µs (this process), best of ``rounds`` rounds of
    ``calls``: the least disturbed round on a shared box."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - started) / calls)
    return best * 1e6
