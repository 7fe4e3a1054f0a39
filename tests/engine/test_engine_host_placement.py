"""Where the step thread runs beside the event loop: bound to one CPU, measured, or free."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.core import host_placement
from engine.core.host_placement import SETTLE_STEPS, TRIALS, WINDOW_STEPS, HostThreads
from engine.errors import ConfigError

needs_two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="binding threads needs Linux and two CPUs",
)


def _on_thread(work: Callable[[], Any]) -> Any:
    """Run `work` on a fresh thread (a stand-in event loop thread or step thread)."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(work()))
    thread.start()
    thread.join()
    return box[0]


class _Threads:
    """An event loop thread and a step thread that run what they are handed, in order."""

    def __init__(self) -> None:
        self._jobs = {name: [] for name in ("loop", "step")}
        self._ready = {name: threading.Semaphore(0) for name in ("loop", "step")}
        self._done = {name: threading.Semaphore(0) for name in ("loop", "step")}
        self._results: dict[str, Any] = {}
        self.threads = {
            name: threading.Thread(target=self._serve, args=(name,), daemon=True)
            for name in ("loop", "step")
        }
        for thread in self.threads.values():
            thread.start()

    def _serve(self, name: str) -> None:
        while True:
            self._ready[name].acquire()
            job = self._jobs[name].pop(0)
            if job is None:
                return
            self._results[name] = job()
            self._done[name].release()

    def run(self, name: str, job: Callable[[], Any]) -> Any:
        self._jobs[name].append(job)
        self._ready[name].release()
        self._done[name].acquire()
        return self._results[name]

    def mask(self, name: str) -> set[int]:
        return os.sched_getaffinity(self.threads[name].native_id)

    def close(self) -> None:
        for name in self._jobs:
            self._jobs[name].append(None)
            self._ready[name].release()


@pytest.fixture
def threads():
    made = _Threads()
    yield made
    made.close()


def test_config_names_the_field():
    with pytest.raises(ConfigError, match="host_threads must be auto, one-cpu or free"):
        EngineConfig(model="x", host_threads="pinned")


def test_free_never_binds(threads):
    placement = HostThreads("free", math_on_host=False)
    assert placement.report.decided and not placement.report.one_cpu
    everything = threads.mask("loop")
    threads.run("loop", placement.note_loop_thread)
    threads.run("step", lambda: placement.after_step(True, 256))
    assert threads.mask("loop") == everything == threads.mask("step")


def test_auto_stays_free_when_the_model_computes_on_the_cpu():
    placement = HostThreads("auto", math_on_host=True)
    assert placement.report.decided and not placement.report.one_cpu
    assert "math runs on the host CPU" in placement.report.reason


@needs_two_cpus
def test_one_cpu_binds_both_threads_and_release_unbinds(threads):
    placement = HostThreads("one-cpu", math_on_host=False)
    everything = threads.mask("loop")
    threads.run("loop", placement.note_loop_thread)
    threads.run("step", lambda: placement.after_step(False, 1))
    report = placement.report
    assert report.decided and report.one_cpu and report.cpu is not None
    assert threads.mask("loop") == {report.cpu} == threads.mask("step")
    placement.release()
    assert threads.mask("loop") == everything == threads.mask("step")


def _measure(threads: _Threads, placement: HostThreads, cost: Callable[[bool], float]) -> None:
    """Feed decode steps of 256 tokens until the placement decides; a step costs `cost(bound)`
    step-thread seconds on the fake clock."""
    clock = [0.0]
    placement._clock = lambda: clock[0]
    for _ in range(2 * TRIALS * (SETTLE_STEPS + WINDOW_STEPS) + 4):
        if placement.report.decided:
            return
        clock[0] += cost(placement._bound)
        threads.run("step", lambda: placement.after_step(True, 256))
    raise AssertionError("no decision")


@needs_two_cpus
@pytest.mark.parametrize("cheaper_bound", [True, False])
def test_auto_keeps_the_placement_that_measures_cheaper(threads, cheaper_bound):
    placement = HostThreads("auto", math_on_host=False)
    everything = threads.mask("loop")
    threads.run("loop", placement.note_loop_thread)

    def cost(bound: bool) -> float:
        return 0.0005 if bound == cheaper_bound else 0.001

    _measure(threads, placement, cost)
    report = placement.report
    assert len(report.one_cpu_us_per_token) == len(report.free_us_per_token) == TRIALS
    assert report.one_cpu is cheaper_bound
    if cheaper_bound:
        assert set(report.one_cpu_us_per_token) == {round(1e6 * 0.0005 / 256, 3)}
        assert threads.mask("loop") == {report.cpu} == threads.mask("step")
    else:
        assert threads.mask("loop") == everything == threads.mask("step")
    assert report.reason.startswith("timed:")


@needs_two_cpus
def test_prefill_steps_restart_the_window(threads):
    placement = HostThreads("auto", math_on_host=False)
    threads.run("loop", placement.note_loop_thread)
    for _ in range(SETTLE_STEPS + WINDOW_STEPS - 1):  # one short of a window
        threads.run("step", lambda: placement.after_step(True, 256))
    threads.run("step", lambda: placement.after_step(False, 256))  # a prefill: start again
    threads.run("step", lambda: placement.after_step(True, 256))
    assert not placement.report.free_us_per_token
    for _ in range(SETTLE_STEPS + WINDOW_STEPS - 1):  # the rest of a new window
        threads.run("step", lambda: placement.after_step(True, 256))
    assert len(placement.report.free_us_per_token) == 1


@needs_two_cpus
def test_a_second_event_loop_unbinds(threads):
    placement = HostThreads("one-cpu", math_on_host=False)
    everything = threads.mask("loop")
    threads.run("loop", placement.note_loop_thread)
    threads.run("step", lambda: placement.after_step(True, 1))
    assert placement.report.one_cpu
    _on_thread(placement.note_loop_thread)  # streams now come from another event loop too
    threads.run("step", lambda: placement.after_step(True, 1))
    assert not placement.report.one_cpu
    assert "several event loops" in placement.report.reason
    assert threads.mask("loop") == everything == threads.mask("step")


def test_a_single_cpu_process_has_nothing_to_bind(monkeypatch):
    monkeypatch.setattr(host_placement.os, "sched_getaffinity", lambda pid: {0})
    placement = HostThreads("auto", math_on_host=False)
    assert placement.report.decided and not placement.report.one_cpu
    assert "one CPU already" in placement.report.reason
