"""``BatchRunner``: every replica's share of the batch work, beside its requests.

Each turn (every ``poll_interval_s``, or as soon as a line ends) the runner looks at the open
batches in the store, oldest first:

- ``validating``: reads the input file and checks every line (``jsonl.py``); the batch starts
  (``in_progress``, its lines stored) or fails with the problems found. Two replicas doing it
  at once store the lines once.
- ``in_progress``: first sorts its lines once (``native/runner.py``): those routed to a
  ``batch: native`` provider go to its batch API, worked (submitted, polled, their results
  recorded) beside the others each turn; then claims lines under a lease, as many as its free
  slots (``concurrency``, shared fairly between the batches), and runs each through the
  pipeline with the batch's key (``LineRunner``); a batch whose lines are all answered is
  closed as ``completed``; one past its window, as ``expired`` (its upstream batches cancelled
  and ended first).
- ``cancelling``: once no line runs any more (and its upstream batches, cancelled, have
  ended), closed as ``cancelled``.
- ``finalizing`` left behind by a replica that died while closing it: closed again.

A line first waits for the key's headroom (``headroom.py``) and, for a model of the local engine,
for the engine to run no interactive request (``local_admission.py``, which also calls a line
back when one arrives); right before its call the runner reads the batch's cancel mark
(``cancels.py``). An answer is recorded once (``BatchStore.answer``); a 429
that waiting can cure gives the line back and makes the key's lines back off. The runner renews
its leases every third of ``lease_s``; a replica killed mid-batch stops renewing, and once its
leases lapse the other replicas claim its lines again.

Closing a batch (under a lease on the batch row) closes its unanswered lines as ``cancelled``
or ``expired``, writes its output and error files (Anthropic: its results file), and records the
final status and counts in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.batches.cancels import CancelMarks
from gateway.batches.headroom import Headroom
from gateway.batches.jsonl import (
    BatchError,
    BatchErrors,
    InputRefused,
    OpenAiFiles,
    anthropic_results,
    openai_lines,
)
from gateway.batches.lines import LineCall, LineResult, LineRunner, line_answer
from gateway.batches.local_admission import LocalAdmission
from gateway.batches.native.runner import NativeRunner
from gateway.batches.records import (
    OUTPUT_PURPOSE,
    BatchRecord,
    ClaimedLine,
    FileRecord,
    StoredLine,
    derived_file_id,
    line_request_id,
)
from gateway.batches.store import BatchStore
from gateway.server.tasks import cancel_until_done
from gateway.settings import BatchSettings

PAGE = 1000
# a line waiting for the local engine still sees its batch cancelled or expired this often
LOCAL_RECHECK_S = 1.0
SERVER_ERROR = orjson.dumps(
    {
        "error": {
            "message": "The server had an error while processing this request.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
)


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        run_line: LineRunner,
        settings: BatchSettings,
        *,
        headroom: Headroom,
        local: LocalAdmission | None,
        cancels: CancelMarks,
        log: Any,
        native: Callable[[str], NativeRunner],
        owner: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``native``: makes the runner of the batch's native lines, for this ``owner``."""
        self.store = store
        self.run_line = run_line
        self.settings = settings
        self.headroom = headroom
        self.local = local
        self.cancels = cancels
        self.log = log
        self.owner = owner or "runner-" + secrets.token_hex(8)
        self.clock = clock
        self.native = native(self.owner)
        self._lines: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._turns()),
            asyncio.create_task(self._renewals()),
        ]
        if self.local is not None:
            self._loops.append(asyncio.create_task(self.local.watch()))

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop claiming, give the lines in flight ``grace_s`` to end, then cancel the rest
        (their leases lapse and another replica, or this one after a restart, runs them)."""
        await cancel_until_done(self._loops)
        if self._lines:
            await asyncio.wait(list(self._lines), timeout=grace_s)
        await cancel_until_done(list(self._lines))
        await self.native.stop(grace_s)

    @property
    def running(self) -> int:
        return len(self._lines)

    async def _turns(self) -> None:
        while True:
            try:
                await self.turn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store or Redis away: try again next turn
                self.log.warning("batch_turn_failed", error=f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval_s)
            self._wake.clear()

    async def _renewals(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 3)
            if not self._lines and not self.native.running:
                continue
            try:
                await self.store.renew(self.owner, self.now_ms() + self.settings.lease_ms)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.warning("batch_lease_renewal_failed", error=type(exc).__name__)

    # -- one turn ------------------------------------------------------------------------

    async def turn(self) -> None:
        batches = await self.store.open_batches()
        running = [batch for batch in batches if batch.status == "in_progress"]
        now = self.now_ms()
        for batch in batches:
            try:
                await self._step(batch, now, share=max(1, self._free() // max(len(running), 1)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one batch's trouble holds up none of the others
                self.log.warning(
                    "batch_step_failed",
                    batch_id=batch.batch_id,
                    error=f"{type(exc).__name__}: {exc}",
                )

    async def _step(self, batch: BatchRecord, now: int, share: int) -> None:
        if batch.status == "validating":
            await self._validate(batch)
            return
        if batch.status == "finalizing":
            await self._close(batch, "completed")
            return
        if batch.status == "in_progress" and batch.routed_ms is None and now < batch.expires_ms:
            await self.native.route(batch)  # its lines are claimed once sorted
            return
        await self.native.work(batch)
        if batch.status == "cancelling":
            await self._close(batch, "cancelled")
        elif now >= batch.expires_ms:
            await self._close(batch, "expired")
        else:
            await self._feed(batch, share)

    def _free(self) -> int:
        return self.settings.concurrency - len(self._lines)

    async def _validate(self, batch: BatchRecord) -> None:
        now = self.now_ms()
        file = await self.store.file(batch.input_file_id) if batch.input_file_id else None
        if file is None:
            problem: BatchError = {
                "code": "file_not_found",
                "message": "the input file no longer exists",
            }
            await self.store.fail(batch.batch_id, _errors_json([problem]), now)
            return
        data = await self.store.file_bytes(file.file_id)
        try:
            lines = await asyncio.to_thread(
                openai_lines, data, batch.endpoint, self.settings.max_lines
            )
        except InputRefused as refused:
            views = [problem.view() for problem in refused.problems]
            if await self.store.fail(batch.batch_id, _errors_json(views), now):
                self.log.info("batch_failed", batch_id=batch.batch_id, problems=len(views))
            return
        if await self.store.start(batch.batch_id, lines, now):
            self.log.info("batch_started", batch_id=batch.batch_id, lines=len(lines))

    async def _feed(self, batch: BatchRecord, share: int) -> None:
        free = min(self._free(), share)
        claimed: list[ClaimedLine] = []
        if free > 0:
            claimed = await self.store.claim_lines(
                batch.batch_id,
                self.owner,
                now_ms=self.now_ms(),
                lease_ms=self.settings.lease_ms,
                limit=free,
            )
        for line in claimed:
            task = asyncio.create_task(self._run(batch, line))
            self._lines.add(task)
            task.add_done_callback(self._line_ended)
        if not claimed and self._free() > 0:
            counts = await self.store.counts(batch.batch_id)
            if counts.open == 0:
                await self._close(batch, "completed")

    def _line_ended(self, task: asyncio.Task[None]) -> None:
        self._lines.discard(task)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            self.log.error("batch_line_failed", error=f"{type(error).__name__}: {error}")

    # -- one line ------------------------------------------------------------------------

    async def _run(self, batch: BatchRecord, line: ClaimedLine) -> None:
        body = orjson.loads(line.body)
        local: bool | None = None
        while True:
            # Read right before the call: no line starts once a cancel was answered.
            if await self._cancelled(batch.batch_id) or self.now_ms() >= batch.expires_ms:
                await self.store.release(batch.batch_id, line.index, self.owner)
                return
            wait = await self.headroom.wait_s(batch.key_id)
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            local = self.local.admit(body) if self.local is not None else None
            if local is not False:
                break
            assert self.local is not None
            await self.local.wait_for_room(LOCAL_RECHECK_S)
        request_id = line_request_id(batch.batch_id, line.index)
        call = LineCall(batch.key_id, batch.endpoint, body, batch.batch_id, request_id)
        try:
            result = await self.run_line(call)
        except asyncio.CancelledError:
            if not (local and self.local is not None and self.local.preempted()):
                raise
            # An interactive request came to the local engine: run this line again later.
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self.log.info("batch_line_preempted", batch_id=batch.batch_id, line=line.index)
            await self.store.release(batch.batch_id, line.index, self.owner)
            return
        except Exception as exc:  # a bug: the line is answered 500, never retried forever
            self.log.error("batch_line_crashed", batch_id=batch.batch_id, error=repr(exc))
            result = LineResult(500, SERVER_ERROR)
        finally:
            if local and self.local is not None:
                self.local.done()
        if result.status == 429 and result.should_retry:
            pause = self.headroom.refused(batch.key_id, result.retry_after_s)
            self.log.info("batch_line_backoff", batch_id=batch.batch_id, pause_s=round(pause, 3))
            await self.store.release(batch.batch_id, line.index, self.owner)
            return
        self.headroom.answered(batch.key_id)
        answer = line_answer(result)
        if not await self.store.answer(
            batch.batch_id, line.index, answer, request_id, self.now_ms()
        ):
            self.log.info("batch_line_answered_elsewhere", batch_id=batch.batch_id, line=line.index)

    async def _cancelled(self, batch_id: str) -> bool:
        marked = await self.cancels.marked(batch_id)
        if marked is not None:
            return marked
        current = await self.store.batch(batch_id)  # Redis cannot say: ask the store
        return current is None or current.status != "in_progress"

    # -- closing -------------------------------------------------------------------------

    async def _close(self, batch: BatchRecord, final: str) -> None:
        now = self.now_ms()
        if final != "completed" and (
            await self.store.running_lines(batch.batch_id, now) > 0
            or await self.store.native.open_count(batch.batch_id) > 0
        ):
            return  # the lines in flight, and upstream batches, finish first (answers kept)
        target = "finalizing" if final == "completed" else batch.status
        if not await self.store.begin_close(
            batch.batch_id,
            self.owner,
            from_status=batch.status,
            to_status=target,
            now_ms=now,
            lease_ms=self.settings.lease_ms,
        ):
            return
        if final != "completed":
            await self.store.close_lines(batch.batch_id, final)
        lines = await self._all_lines(batch.batch_id)
        counts = await self.store.counts(batch.batch_id)
        files, output_id, error_id = self._files(batch, lines)
        if await self.store.finish(
            batch.batch_id,
            self.owner,
            status=final,
            now_ms=self.now_ms(),
            counts=counts,
            files=files,
            output_file_id=output_id,
            error_file_id=error_id,
        ):
            self.log.info(
                "batch_closed",
                batch_id=batch.batch_id,
                status=final,
                completed=counts.completed,
                failed=counts.failed,
                unanswered=counts.cancelled + counts.expired,
            )

    async def _all_lines(self, batch_id: str) -> list[StoredLine]:
        lines: list[StoredLine] = []
        while True:
            page = await self.store.lines(
                batch_id, after=lines[-1].index if lines else -1, limit=PAGE
            )
            lines += page
            if len(page) < PAGE:
                return lines

    def _files(
        self, batch: BatchRecord, lines: list[StoredLine]
    ) -> tuple[list[tuple[FileRecord, bytes]], str | None, str | None]:
        now = self.now_ms()

        def record(role: str, data: bytes) -> tuple[FileRecord, bytes]:
            file_id = derived_file_id(batch.batch_id, role)
            name = f"{batch.batch_id}_{role}.jsonl"
            return FileRecord(file_id, batch.key_id, OUTPUT_PURPOSE, name, len(data), now), data

        if batch.api == "anthropic":
            results = record("results", b"".join(anthropic_results(lines)))
            return [results], results[0].file_id, None
        built = OpenAiFiles.of(batch.batch_id, lines)
        files = []
        output_id = error_id = None
        if built.output:
            files.append(record("output", bytes(built.output)))
            output_id = files[-1][0].file_id
        if built.errors:
            files.append(record("error", bytes(built.errors)))
            error_id = files[-1][0].file_id
        return files, output_id, error_id


def _errors_json(problems: list[BatchError]) -> str:
    errors: BatchErrors = {"object": "list", "data": problems}
    return orjson.dumps(errors).decode()
