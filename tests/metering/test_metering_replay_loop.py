"""The spool replay loop behind the usage and settle spools: it replays only while the spool
holds something, and a round that raises is logged while the next one still runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.metering.replay_loop import ReplayLoop
from gateway.metering.spool import Spool


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, name: str, **fields: Any) -> None:
        self.lines.append(("info", name, fields))

    def error(self, name: str, **fields: Any) -> None:
        self.lines.append(("error", name, fields))


async def test_a_failed_round_is_logged_and_the_next_one_runs(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.append_sync(b'{"n": 1}')
    failures: list[Exception] = [ValueError("a bug"), RedisConnectionError("away")]
    replayed = asyncio.Event()
    rounds = 0

    async def replay() -> None:
        nonlocal rounds
        rounds += 1
        if failures:
            raise failures.pop(0)
        replayed.set()

    log = Log()
    loop = ReplayLoop("usage", spool, replay, interval_s=0.01, log=log)
    await loop.start()
    try:
        await asyncio.wait_for(replayed.wait(), 5)
    finally:
        await loop.stop()
    assert rounds == 3
    assert [(level, name, fields["reason"]) for level, name, fields in log.lines] == [
        ("error", "usage_replay_failed", "ValueError"),
        ("info", "usage_replay_deferred", "ConnectionError"),
    ]
    assert log.lines[0][2]["exc_info"] is True  # a failure that is not Redis's has its traceback


async def test_no_round_while_the_spool_is_empty(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    called = asyncio.Event()

    async def replay() -> None:
        called.set()

    loop = ReplayLoop("settle", spool, replay, interval_s=0.01, log=Log())
    await loop.start()
    try:
        await asyncio.sleep(0.1)
        assert not called.is_set()
        spool.append_sync(b'{"n": 1}')
        await asyncio.wait_for(called.wait(), 5)
    finally:
        await loop.stop()
    await loop.stop()  # stopping twice is harmless
