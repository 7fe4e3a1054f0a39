"""Where the step thread runs beside the event loop thread that reads its outputs.

The two threads take turns under the GIL: each step, the step thread hands its tokens over
and the event loop turns them into text for every stream. When the turns alternate between
two CPUs the same work costs more CPU (the likely cause: CPython 3.11 writes a reference
count on every use, so what both threads touch moves between the CPUs' caches each turn): on
a 2-core AMD EPYC VM the host benchmark's decode step took 1.3x (up to 2x) the CPU of all
threads, and up to 4.6x the wall time, that it took with both threads on one CPU
(docs/benchmarks.md). Whether that holds depends on the machine and the load, so `auto`
measures it on the engine's own decode steps: windows of steps on one CPU and free, taking
turns, compared by the step thread's CPU time per token (it pays the moves as the event
loop does, and no other work of the process blurs it), and keeps one CPU only when it is
clearly cheaper. It stays free when the model's math runs on
the host CPU (its threads need every core) and when streams come from several event loops.

One CPU means: the event loop thread and the step thread are bound to the CPU the event loop
thread was running on. Threads the event loop thread starts while bound inherit the binding
(Linux's rule), so a gateway's worker-thread jobs share that CPU. `shutdown` unbinds.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MODES = ("auto", "one-cpu", "free")
WINDOW_STEPS = 16  # decode steps per measured window
SETTLE_STEPS = 4  # steps left out after a switch: the caches move over to the new placement
TRIALS = 3  # windows per placement, taken in turns
KEEP_ONE_CPU_BELOW = 0.9  # one CPU must cost under this share of the free placement's CPU


def _supported() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def _cpu_of(native_id: int) -> int | None:
    """The CPU a thread of this process last ran on (field 39 of its /proc stat)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[36])
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class PlacementReport:
    """The choice and the figures behind it (`AsyncEngine.host_placement`)."""

    mode: str
    one_cpu: bool = False
    cpu: int | None = None  # the CPU kept (it stays named after shutdown unbinds)
    decided: bool = False
    reason: str = "no stream yet"
    one_cpu_us_per_token: list[float] = field(default_factory=list)
    free_us_per_token: list[float] = field(default_factory=list)


class HostThreads:
    """Binds, measures and unbinds; `note_loop_thread` runs on event loop threads, the rest
    on the step thread (and `release` at shutdown)."""

    def __init__(
        self, mode: str, math_on_host: bool, clock: Callable[[], float] = time.thread_time
    ) -> None:
        """`clock`: the step thread's CPU seconds (a test passes its own)."""
        self.report = PlacementReport(mode)
        self._clock = clock
        self._lock = threading.Lock()
        self._loop_thread: int | None = None
        self._loop_mask: set[int] | None = None
        self._step_thread: int | None = None
        self._step_mask: set[int] | None = None
        self._conflict = False
        self._bound = False
        self._window_cpu = 0.0
        self._window_tokens = 0
        self._window_steps = 0
        self._active = _supported() and mode != "free"
        if mode == "free":
            self._finish(False, "host_threads: free")
        elif not _supported():
            self._finish(False, "this platform cannot bind threads to a CPU")
        elif len(os.sched_getaffinity(0)) < 2:
            self._finish(False, "the process runs on one CPU already")
        elif mode == "auto" and math_on_host:
            self._finish(False, "the model's math runs on the host CPU and needs every core")

    # --- event loop threads ------------------------------------------------------------

    def note_loop_thread(self) -> None:
        """Called on an event loop thread that opens a stream."""
        if not self._active:
            return
        native_id = threading.get_native_id()
        with self._lock:
            if self._loop_thread is None:
                self._loop_thread = native_id
                self._loop_mask = os.sched_getaffinity(0)
            elif self._loop_thread != native_id:
                self._conflict = True

    # --- the step thread ---------------------------------------------------------------

    def after_step(self, decode_only: bool, tokens: int) -> None:
        """After each engine step: measure (`auto`) or bind (`one-cpu`)."""
        if not self._active or self._loop_thread is None:
            return
        if self._conflict:
            self._unbind()
            self._finish(False, "streams come from several event loops")
            return
        if self.report.decided:
            return
        if self.report.mode == "one-cpu":
            bound = self._bind()
            self._finish(bound, "host_threads: one-cpu" + ("" if bound else ", but binding failed"))
            return
        now = self._clock()
        if not decode_only or not tokens:
            self._window_steps = 0  # a window holds decode steps only
            return
        self._window_steps += 1
        if self._window_steps <= SETTLE_STEPS:
            self._window_cpu, self._window_tokens = now, 0
            return
        self._window_tokens += tokens
        if self._window_steps < SETTLE_STEPS + WINDOW_STEPS:
            return
        us_per_token = 1e6 * (now - self._window_cpu) / self._window_tokens
        self._window_steps = 0
        report = self.report
        (report.one_cpu_us_per_token if self._bound else report.free_us_per_token).append(
            round(us_per_token, 3)
        )
        if len(report.one_cpu_us_per_token) < TRIALS:
            if self._bound:
                self._unbind()
            elif not self._bind():
                self._finish(False, "could not bind to a CPU")
            return
        one_cpu = statistics.median(report.one_cpu_us_per_token)
        free = statistics.median(report.free_us_per_token)
        keep = one_cpu < KEEP_ONE_CPU_BELOW * free
        if not keep:
            self._unbind()
        self._finish(
            keep, f"timed: {one_cpu:.2f} us of step-thread CPU a token on one CPU, {free:.2f} free"
        )

    def release(self) -> None:
        """Unbind (at shutdown): the event loop thread gets its own CPUs back."""
        with self._lock:
            self._unbind()
            self._active = False

    # --- binding -----------------------------------------------------------------------

    def _bind(self) -> bool:
        loop_thread = self._loop_thread
        if loop_thread is None:
            return False
        if self._bound:
            return True
        cpu = _cpu_of(loop_thread)
        if cpu is None:
            return False
        try:
            self._step_thread = threading.get_native_id()
            self._step_mask = os.sched_getaffinity(0)
            os.sched_setaffinity(loop_thread, {cpu})
            os.sched_setaffinity(0, {cpu})
        except OSError as exc:  # the thread is gone, or a cgroup took that CPU away
            log.warning("could not bind the engine's threads to CPU %d: %s", cpu, exc)
            return False
        self._bound = True
        self.report.cpu = cpu
        return True

    def _unbind(self) -> None:
        if not self._bound:
            return
        self._bound = False
        try:
            if self._loop_thread is not None and self._loop_mask is not None:
                os.sched_setaffinity(self._loop_thread, self._loop_mask)
            if self._step_thread is not None and self._step_mask is not None:
                os.sched_setaffinity(self._step_thread, self._step_mask)
        except OSError as exc:  # the event loop thread has ended
            log.debug("unbinding the engine's threads: %s", exc)

    def _finish(self, one_cpu: bool, reason: str) -> None:
        report = self.report
        report.one_cpu, report.decided, report.reason = one_cpu, True, reason
        if not one_cpu:
            report.cpu = None
        self._active = one_cpu  # bound: still watching for a second event loop
        log.info(
            "engine host threads: %s (%s)",
            f"one CPU ({report.cpu})" if one_cpu else "free",
            reason,
        )
