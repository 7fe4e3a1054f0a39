"""Lines refused the local engine wait for room instead of asking again on a timer: the wait
ends when a look finds the engine free of interactive requests, or when a line ends, and not
while an interactive request holds the engine (so they cost nothing while it runs).

The engine here is a stand-in that reports a load; ``test_batches_local.py`` runs the real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.batches.local_admission import LocalAdmission
from gateway.policy.engine import LocalEngineSettings
from gateway.policy.store import PolicyStore

POLICY = """
providers:
  home:
    kind: local
    engine: {device: cpu, max_num_seqs: 4}
models:
  tiny:
    provider: home
"""


@dataclass
class Engine:
    interactive: int = 0
    lines: int = 0

    def load(self) -> dict[str, Any]:
        return {"num_requests_running": self.interactive + self.lines, "num_requests_waiting": 0}


@dataclass
class Host:
    engine: Engine = field(default_factory=Engine)
    settings: LocalEngineSettings = field(
        default_factory=lambda: LocalEngineSettings(device="cpu", max_num_seqs=4)
    )
    provider_name: str = "home"


def admission(tmp_path: Path, host: Host) -> LocalAdmission:
    path = tmp_path / "routing_rules.yaml"
    path.write_text(POLICY)
    policies = PolicyStore(path)
    policies.load()
    return LocalAdmission(host, policies, share=0.5)  # type: ignore[arg-type]


async def test_a_refused_line_waits_until_the_interactive_request_has_left(
    tmp_path: Path,
) -> None:
    host = Host()
    local = admission(tmp_path, host)
    watch = asyncio.create_task(local.watch())
    try:
        host.engine.interactive = 1
        assert local.admit({"model": "tiny"}) is False
        waiting = asyncio.create_task(local.wait_for_room(30))
        await asyncio.sleep(0.2)  # ten looks: none finds room while the request runs
        assert not waiting.done()
        host.engine.interactive = 0
        await asyncio.wait_for(waiting, 10)  # the next look finds room, well before 30 s
        assert local.admit({"model": "tiny"}) is True
    finally:
        watch.cancel()


async def test_a_line_that_ends_makes_room_for_the_next(tmp_path: Path) -> None:
    host = Host()
    local = admission(tmp_path, host)  # no watch(): the end of a line alone must wake it
    started: list[bool] = []

    async def line() -> None:
        started.append(local.admit({"model": "tiny"}) is True)
        host.engine.lines += 1
        await asyncio.sleep(0.1)
        host.engine.lines -= 1
        local.done()

    first, second = asyncio.create_task(line()), asyncio.create_task(line())
    await asyncio.sleep(0)
    assert started == [True, True]  # share 0.5 of 4 sequences: two lines at once
    assert local.admit({"model": "tiny"}) is False
    await asyncio.wait_for(local.wait_for_room(30), 10)
    await asyncio.gather(first, second)
    assert local.admit({"model": "tiny"}) is True


async def test_lines_for_other_providers_are_not_held(tmp_path: Path) -> None:
    host = Host()
    host.engine.interactive = 1
    local = admission(tmp_path, host)
    assert local.admit({"model": "gpt-4o"}) is None
    assert local.admit({"messages": []}) is None


@dataclass
class CountingEngine(Engine):
    looks: int = 0

    def load(self) -> dict[str, Any]:
        self.looks += 1
        return super().load()


async def test_the_watch_sleeps_while_no_line_runs_or_waits(tmp_path: Path) -> None:
    engine = CountingEngine()
    local = admission(tmp_path, Host(engine=engine))
    watch = asyncio.create_task(local.watch())

    async def line() -> None:
        assert local.admit({"model": "tiny"}) is True
        engine.lines += 1
        try:
            await asyncio.sleep(30)
        finally:
            engine.lines -= 1
            local.done()

    async def until(condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not condition():
                await asyncio.sleep(0.005)

    try:
        await asyncio.sleep(0.2)  # ten looks' worth of time with nothing to look after
        assert engine.looks == 0
        running = asyncio.create_task(line())
        await until(lambda: engine.looks >= 3)  # a line runs: the watch looks again and again
        engine.interactive = 1
        await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 10)
        assert running.cancelled()  # preempted by the next look
        await until(lambda: not local._watched.is_set())  # the watch has gone back to sleep
        looked = engine.looks
        await asyncio.sleep(0.2)
        assert engine.looks == looked  # and stays asleep
    finally:
        watch.cancel()
