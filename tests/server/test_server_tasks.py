"""``cancel_until_done``: a background loop whose first cancel was lost (as Python 3.11's
``asyncio.wait_for`` loses one that lands in the same turn as its result) still ends."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.server.tasks import cancel_until_done


async def test_a_loop_that_lost_its_first_cancel_is_cancelled_again() -> None:
    turns = 0

    async def loop_that_lost_a_cancel() -> None:
        nonlocal turns
        # What a lost cancel looks like from the loop's side: it runs on.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        while True:
            turns += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(loop_that_lost_a_cancel())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_until_done([task]), timeout=5)
    assert task.cancelled() and turns >= 1


async def test_finished_and_failed_tasks_are_collected_without_a_warning() -> None:
    async def fail() -> None:
        raise RuntimeError("logged by its owner")

    done = asyncio.create_task(asyncio.sleep(0))
    failed = asyncio.create_task(fail())
    sleeping = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0.01)
    await cancel_until_done([done, failed, sleeping])
    assert done.done() and not done.cancelled()
    assert isinstance(failed.exception(), RuntimeError)
    assert sleeping.cancelled()
