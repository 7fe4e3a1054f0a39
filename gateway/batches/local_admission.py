"""Batch lines on the in-process engine yield to interactive requests: admitted only into an
engine that runs nothing else, and called back (aborted, to run again later) when an
interactive request arrives.

``LocalAdmission.admit(body)``: a line for a model the local engine serves starts only while
every request in the engine is one of this runner's batch lines (none interactive, running or
waiting), and those fill less than ``share`` of its ``max_num_seqs``. ``watch()`` looks every
``WATCH_S`` while lines run or wait (and sleeps otherwise: an idle gateway is not woken fifty
times a second): once the engine holds a request that is not one of them, every batch line in
it is cancelled: the engine aborts those requests and frees their blocks at once, the lines go back
unanswered and run again later. An interactive request so shares the engine with batch lines
for at most one look and one step: on a CPU, where every extra sequence slows each step, that
is the difference between yielding and not (docs/benchmarks.md). The engine knows no
priorities; this is admission and preemption from outside, and a preempted line's tokens so
far are work thrown away.

A line refused admission waits in ``wait_for_room()`` until a look finds room (or a line ends),
not on a timer of its own: a dozen lines each asking Redis for their batch's state and their
key's headroom every few tens of milliseconds took CPU from the interactive request they had
just made way for, on the same two cores as the engine's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from gateway.policy.store import PolicyStore
from gateway.providers.local_host import LocalEngineHost

WATCH_S = 0.02


class LocalAdmission:
    def __init__(self, host: LocalEngineHost, policies: PolicyStore, *, share: float) -> None:
        self.host = host
        self.policies = policies
        self.share = share
        self._lines: set[asyncio.Task[Any]] = set()  # admitted to the engine, not done
        self._preempted: set[asyncio.Task[Any]] = set()
        self._room = asyncio.Event()  # set while a line would be admitted
        self._waiting = 0  # lines in wait_for_room()
        self._watched = asyncio.Event()  # set while there are lines to look after

    @property
    def running(self) -> int:
        return len(self._lines)

    def admit(self, body: dict[str, Any]) -> bool | None:
        """None: the line is not for the local engine (nothing to hold); True: admitted, for
        the current task (which calls ``done()`` when the line ends); False: wait, ask again."""
        engine, settings = self.host.engine, self.host.settings
        policy = self.policies.policy_or_none()
        model = body.get("model")
        if engine is None or settings is None or policy is None or not isinstance(model, str):
            return None
        name = policy.resolve_model(model)
        config = policy.models.get(name) if name is not None else None
        if config is None or config.provider != self.host.provider_name:
            return None
        if not self._has_room():
            self._room.clear()
            return False
        task = asyncio.current_task()
        assert task is not None
        self._lines.add(task)
        self._watched.set()
        return True

    def done(self) -> None:
        task = asyncio.current_task()
        self._lines.discard(task)  # type: ignore[arg-type]
        self._preempted.discard(task)  # type: ignore[arg-type]
        self._note_room()

    async def wait_for_room(self, timeout_s: float) -> None:
        """Until a line would be admitted, or ``timeout_s`` (the caller's own checks, such as
        a cancel of its batch, still run that often)."""
        self._waiting += 1
        self._watched.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), timeout_s)
        finally:
            self._waiting -= 1

    def _has_room(self) -> bool:
        settings = self.host.settings
        if settings is None:
            return False
        room = max(1, math.floor(self.share * settings.max_num_seqs))
        return self._others() <= 0 and self.running < room

    def _note_room(self) -> None:
        if self._has_room():
            self._room.set()
        else:
            self._room.clear()

    def preempted(self) -> bool:
        """Whether the current task was cancelled by ``watch()`` (not by a shutdown)."""
        return asyncio.current_task() in self._preempted

    def _others(self) -> int:
        """Requests in the engine that are not this runner's batch lines (a line admitted but
        not in the engine yet can hide one for a moment; the next look finds it)."""
        engine = self.host.engine
        if engine is None:
            return 0
        load = engine.load()
        return load["num_requests_running"] + load["num_requests_waiting"] - self.running

    async def watch(self) -> None:
        while True:
            if not self._lines and not self._waiting:
                self._watched.clear()
                await self._watched.wait()
            await asyncio.sleep(WATCH_S)
            self._note_room()
            if not self._lines or self._others() <= 0:
                continue
            for task in self._lines - self._preempted:
                self._preempted.add(task)
                task.cancel()
