"""What the native fakes' batch APIs share (``native_openai``'s Batch API, ``native_anthropic``'s
Message Batches): a queue of upstream batches that end after a poll or two, as a provider's
do after a while.

A batch is created ``running``; the ``polls_to_end``-th look at it (a GET of it) runs its
requests and ends it ``completed``. Each request runs as the fake's own interactive endpoint
answers it (``run``: the fake calls itself over HTTP with its own key, so a batch request is
checked, answered and booked exactly as a request is, and fails as one does: a model named
``filtered`` or ``ctx-overflow``). ``hold = True`` keeps new batches running until they are
cancelled: a cancel ends a batch at its next look, ``cancelled``, with its first
``ran_before_cancel`` share of requests answered and the rest never run (each run in a task of
its own, so a poll whose client gave up does not run a request twice). ``expire(id)`` ends a
running batch ``expired`` with none run. The queue counts what it was asked (``submissions``,
``polls``, ``cancels``), so a test sees a batch submitted once.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

# Runs one request of a batch: its custom_id's body → the status and JSON body answered.
RunRequest = Callable[[dict[str, Any]], Awaitable[tuple[int, Any]]]


@dataclass
class Result:
    custom_id: str
    outcome: str  # answered | cancelled | expired
    status: int = 0
    body: Any = None


@dataclass
class FakeBatch:
    id: str
    requests: list[tuple[str, dict[str, Any]]]
    metadata: dict[str, Any] | None
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "running"  # running | cancelling | ended
    ended_as: str | None = None  # completed | cancelled | expired
    looks: int = 0
    results: list[Result] = field(default_factory=list)
    # Its requests being run: a task of its own, so a poll whose client gave up (a loaded box)
    # leaves it running, and the next poll takes its results (each request runs once).
    work: asyncio.Future[list[Result]] | None = None


class BatchQueue:
    def __init__(self, prefix: str, polls_to_end: int = 2) -> None:
        self.prefix = prefix
        self.polls_to_end = polls_to_end
        self.hold = False
        self.ran_before_cancel = 0.5
        self.batches: dict[str, FakeBatch] = {}
        self.submissions = 0
        self.polls = 0
        self.cancels = 0

    def reset(self) -> None:
        self.batches.clear()
        self.submissions = self.polls = self.cancels = 0
        self.hold = False

    def submit(
        self, requests: list[tuple[str, dict[str, Any]]], metadata: dict[str, Any] | None = None
    ) -> FakeBatch:
        self.submissions += 1
        batch = FakeBatch(self.prefix + secrets.token_hex(12), requests, metadata)
        self.batches[batch.id] = batch
        return batch

    def newest_first(self) -> list[FakeBatch]:
        return list(reversed(self.batches.values()))

    async def look(self, batch_id: str, run: RunRequest) -> FakeBatch | None:
        """A poll: the batch, moved on as time would move it."""
        batch = self.batches.get(batch_id)
        if batch is None:
            return None
        self.polls += 1
        batch.looks += 1
        if batch.status == "cancelling":
            ran = int(len(batch.requests) * self.ran_before_cancel)
            results = await self._work(batch, batch.requests[:ran], run)
            batch.results = results + [Result(cid, "cancelled") for cid, _ in batch.requests[ran:]]
            batch.status, batch.ended_as = "ended", "cancelled"
        elif batch.status == "running" and not self.hold and batch.looks >= self.polls_to_end:
            batch.results = await self._work(batch, batch.requests, run)
            batch.status, batch.ended_as = "ended", "completed"
        return batch

    async def _work(
        self, batch: FakeBatch, requests: list[tuple[str, dict[str, Any]]], run: RunRequest
    ) -> list[Result]:
        if batch.work is None:
            batch.work = asyncio.ensure_future(self._run(requests, run))
        return list(await asyncio.shield(batch.work))

    def cancel(self, batch_id: str) -> FakeBatch | None:
        batch = self.batches.get(batch_id)
        if batch is not None:
            self.cancels += 1
            if batch.status == "running":
                batch.status = "cancelling"
        return batch

    def expire(self, batch_id: str) -> None:
        batch = self.batches[batch_id]
        batch.results = [Result(cid, "expired") for cid, _ in batch.requests]
        batch.status, batch.ended_as = "ended", "expired"

    @staticmethod
    async def _run(requests: list[tuple[str, dict[str, Any]]], run: RunRequest) -> list[Result]:
        results = []
        for custom_id, body in requests:
            status, answer = await run(body)
            results.append(Result(custom_id, "answered", status, answer))
        return results
