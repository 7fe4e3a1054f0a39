"""Stopping background tasks: ``cancel_until_done`` cancels tasks and waits until each ends.

A single ``Task.cancel()`` is not enough on Python 3.11: ``asyncio.wait_for``, which redis-py
awaits to send every command when a socket timeout is set (ours always is), returns its inner result when that completes in the same loop turn
as the cancel, and the cancel is lost (bpo-42130, fixed in 3.12 by rebuilding ``wait_for`` on
``asyncio.timeout``). A background loop whose cancel was lost runs on, and a shutdown that
awaits it waits forever. So a task still running after a short wait is cancelled again, with
the wait doubling, until it ends. Tasks stopped here must treat any cancel as final: their
clean-up, if any, must not await for long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

FIRST_WAIT_S = 0.05
MAX_WAIT_S = 1.0


async def cancel_until_done(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and return once every one has ended; their exceptions are retrieved
    (they were the tasks' owner's to log) so asyncio does not report them as never read."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    wait_s = FIRST_WAIT_S
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=wait_s)
        wait_s = min(wait_s * 2, MAX_WAIT_S)
    for task in tasks:
        if not task.cancelled():
            task.exception()
