"""``NativeRunner``: the lines of a batch that go to a provider's own batch API
(``batch: native``), beside the ones the gateway runs itself (``gateway/batches/runner.py``,
which calls it each turn).

- **Sorting** (``route``, once per batch, before any line is claimed, under a lease on the
  batch row): each line is routed as the pipeline would route it (``NativeLines.route``);
  those landing on a ``batch: native`` provider in its own format take a budget hold for their
  worst case (held until the batch's window ends and a day more, counting no RPM or TPM) and
  become ``native`` lines of one upstream batch per provider, recorded with the batch marked
  routed in one transaction. A line whose hold is refused stays with the pipeline, which
  answers it with its 429 ``insufficient_quota``.
- **Submission** (an upstream batch in ``submitting``, under its lease): its requests go to the
  provider; the provider's batch id is recorded in the one step that makes it ``submitted``.
  A submission begun before (``tries`` above 1: the replica died, or stalled past its lease,
  between its ``POST`` and that record) first looks for the upstream batch it may have made
  (``BatchApi.find``: OpenAI's metadata; Anthropic keeps none, so its lines are submitted
  again). Of two replicas that both submitted, the second to record cancels its own copy.
- **Polling** (every ``native_poll_s``, by any replica): a batch cancelled or past its window
  cancels its upstream batch; an ended one has its results recorded on their lines, each as a
  request of the key through the pipeline's end (``NativeLines.record``: its usage event, its
  hold settled), then answered once (``NativeStore.answer``); a result that never ran closes
  its line ``cancelled`` or ``expired`` (its hold given back); a line the provider left without
  a result is answered with a 502.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from gateway.batches.cancels import CancelMarks
from gateway.batches.lines import LineCall, LineResult, line_answer
from gateway.batches.native.lines import NativeLines, NativeOutcome, NativeRoute
from gateway.batches.native.store import NativeBatch, NativeLine, native_id_of
from gateway.batches.native.upstream import BatchApi, NativeRequest, NativeResult
from gateway.batches.records import BatchRecord, line_request_id
from gateway.batches.store import BatchStore
from gateway.errors import UpstreamError
from gateway.metering.limits import Limiter, LimiterUnavailable, Reservation
from gateway.metering.settle_spool import SpooledSettle
from gateway.server.tasks import cancel_until_done
from gateway.settings import BatchSettings

PAGE = 1000
# Results recorded at once (each a request's end: its usage record made durable).
RECORD_CHUNK = 64
# Budget holds outlive the batch's window by a day: an upstream batch cancelled at the end of
# the window still has its results recorded against them.
HOLD_MARGIN_MS = 24 * 3600 * 1000
NO_RESULT = orjson.dumps(
    {"error": {"message": "the provider's batch ended without a result for this request"}}
)


def native_record_id(batch_id: str, index: int) -> str:
    """A native line's usage event id: recorded again (a replica died after recording it,
    before answering the line), it is the same event, which the ledger keeps once."""
    return hashlib.sha256(f"{batch_id}:{index}:native".encode()).hexdigest()[:32]


def hold_id(batch_id: str, index: int) -> str:
    """A native line's budget hold: taken again after a crash, it is the one held."""
    return "hold-" + line_request_id(batch_id, index)


class NativeRunner:
    def __init__(
        self,
        store: BatchStore,
        lines: NativeLines,
        settings: BatchSettings,
        *,
        limiter: Limiter,
        cancels: CancelMarks,
        log: Any,
        owner: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.lines = lines
        self.settings = settings
        self.limiter = limiter
        self.cancels = cancels
        self.log = log
        self.owner = owner
        self.clock = clock
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def poll_ms(self) -> int:
        return round(self.settings.native_poll_s * 1000)

    @property
    def running(self) -> int:
        return len(self._tasks)

    async def stop(self, grace_s: float) -> None:
        """Let the work in flight end within ``grace_s``; what is cut off is redone after its
        lease lapses (by this replica after a restart, or another)."""
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)
        await cancel_until_done(tasks)

    def _call(self, batch: BatchRecord, index: int, body: str) -> LineCall:
        request_id = line_request_id(batch.batch_id, index)
        return LineCall(
            batch.key_id, batch.endpoint, orjson.loads(body), batch.batch_id, request_id
        )

    # -- sorting a batch's lines -----------------------------------------------------------

    async def route(self, batch: BatchRecord) -> None:
        """Sort the batch's lines into native ones and the pipeline's, once."""
        store, now = self.store.native, self.now_ms()
        if not self.lines.native_providers():
            await store.record_routes(batch.batch_id, [], [], now)
            return
        lease_ms = self.settings.lease_ms
        if not await store.take_routing(batch.batch_id, self.owner, now_ms=now, lease_ms=lease_ms):
            return
        hold_ms = batch.expires_ms - now + HOLD_MARGIN_MS
        groups: dict[str, list[tuple[int, NativeRoute]]] = {}
        after = -1
        while True:
            page = await store.pending_lines(batch.batch_id, after=after, limit=PAGE)
            routes = await asyncio.gather(
                *(
                    self.lines.route(
                        self._call(batch, line.index, line.body),
                        hold_id=hold_id(batch.batch_id, line.index),
                        hold_ms=hold_ms,
                    )
                    for line in page
                )
            )
            for line, route in zip(page, routes, strict=True):
                if route is not None:
                    groups.setdefault(route.provider, []).append((line.index, route))
            if len(page) < PAGE:
                break
            after = page[-1].index
            # A long sorting keeps its lease (the same owner takes it again).
            await store.take_routing(
                batch.batch_id, self.owner, now_ms=self.now_ms(), lease_ms=lease_ms
            )
        natives, assigned = [], []
        for provider, routed in groups.items():
            native_id = native_id_of(batch.batch_id, provider)
            hold = next((route.hold for _, route in routed if route.hold is not None), None)
            natives.append(
                NativeBatch(
                    native_id=native_id,
                    batch_id=batch.batch_id,
                    provider=provider,
                    state="submitting",
                    upstream_id=None,
                    upstream_status=None,
                    hold_json=_hold_json(hold),
                    lines=len(routed),
                    tries=0,
                    owner=None,
                    lease_until_ms=None,
                    next_poll_ms=now,
                    created_ms=now,
                )
            )
            assigned += [(index, native_id, route.model) for index, route in routed]
        await store.record_routes(batch.batch_id, natives, assigned, self.now_ms())
        self.log.info(
            "batch_routed",
            batch_id=batch.batch_id,
            native={native.provider: native.lines for native in natives},
        )

    # -- working its upstream batches ------------------------------------------------------

    async def work(self, batch: BatchRecord) -> None:
        """Start the work that is due on the batch's upstream batches, each in a task."""
        if batch.routed_ms is None:
            return
        now = self.now_ms()
        for native in await self.store.native.natives(batch.batch_id):
            if native.state == "ended" or native.native_id in self._tasks:
                continue
            held = native.owner not in (None, self.owner) and (native.lease_until_ms or 0) >= now
            if native.next_poll_ms > now or held:
                continue
            task = asyncio.create_task(self._work(batch, native.native_id))
            self._tasks[native.native_id] = task
            task.add_done_callback(lambda done, key=native.native_id: self._done(key, done))

    def _done(self, native_id: str, task: asyncio.Task[None]) -> None:
        self._tasks.pop(native_id, None)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            self.log.error("batch_native_crashed", native_id=native_id, error=repr(error))

    async def _work(self, batch: BatchRecord, native_id: str) -> None:
        store = self.store.native
        native = await store.take(
            native_id, self.owner, now_ms=self.now_ms(), lease_ms=self.settings.lease_ms
        )
        if native is None:
            return  # another replica took it first
        try:
            if native.state == "submitting":
                await self._submit(batch, native)
            else:
                await self._poll(batch, native)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the provider or the store away: tried again at the next poll
            self.log.warning(
                "batch_native_failed",
                batch_id=batch.batch_id,
                provider=native.provider,
                error=f"{type(exc).__name__}: {exc}",
            )
            await store.polled(
                native_id,
                self.owner,
                upstream_status=None,
                next_poll_ms=self.now_ms() + self.poll_ms,
            )

    async def _stopping(self, batch_id: str) -> str | None:
        """``cancelled`` or ``expired`` when the batch's lines must not run (any longer)."""
        current = await self.store.batch(batch_id)
        if current is None or current.status not in ("in_progress", "finalizing"):
            return "cancelled"
        if await self.cancels.marked(batch_id):
            return "cancelled"
        return "expired" if self.now_ms() >= current.expires_ms else None

    async def _submit(self, batch: BatchRecord, native: NativeBatch) -> None:
        api = self.lines.batch_api(native.provider)
        lines = await self.store.native.lines(batch.batch_id, native.native_id)
        lines = [line for line in lines if line.state == "native"]
        if native.tries > 1 and api is not None:
            # An earlier submission may have reached the provider: find it, not make another.
            found = await api.find(native.native_id, native.created_ms)
            if found is not None:
                self.log.info("batch_native_found", native_id=native.native_id, upstream=found)
                await self._submitted(native, api, found)
                return
        stop = await self._stopping(batch.batch_id)
        if stop is not None or not lines:
            await self._end_unrun(batch, native, lines, stop or "expired")
            return
        if api is None:  # the provider left the policy, or is native no more
            await self._give_back(batch, native, lines)
            await self.store.native.ended(
                native.native_id, upstream_status=None, now_ms=self.now_ms()
            )
            return
        requests, back = [], []
        for line in lines:
            route = NativeRoute(native.provider, line.model, None)
            body = await self.lines.upstream_body(self._call(batch, line.index, line.body), route)
            if body is None:
                back.append(line)
            else:
                requests.append(NativeRequest(line.custom_id, body))
        await self._give_back(batch, native, back)
        if not requests:
            await self.store.native.ended(
                native.native_id, upstream_status=None, now_ms=self.now_ms()
            )
            return
        if native.tries > 1:
            self.log.warning(
                "batch_native_resubmitted", native_id=native.native_id, tries=native.tries
            )
        try:
            upstream_id = await api.submit(native.native_id, batch.endpoint, requests)
        except UpstreamError as exc:
            if exc.retryable:
                raise  # tried again at the next poll
            # The provider refuses the batch (an OpenAI-compatible server without a batch
            # API, a request its batch API does not take): the pipeline runs its lines.
            self.log.error("batch_native_refused", native_id=native.native_id, error=str(exc))
            await self._give_back(batch, native, lines)
            await self.store.native.ended(
                native.native_id, upstream_status=None, now_ms=self.now_ms()
            )
            return
        await self._submitted(native, api, upstream_id)

    async def _submitted(self, native: NativeBatch, api: BatchApi, upstream_id: str) -> None:
        store, now = self.store.native, self.now_ms()
        if await store.submitted(
            native.native_id, upstream_id, now_ms=now, next_poll_ms=now + self.poll_ms
        ):
            self.log.info(
                "batch_native_submitted",
                batch_id=native.batch_id,
                provider=native.provider,
                upstream=upstream_id,
                lines=native.lines,
            )
            return
        recorded = [
            n for n in await store.natives(native.batch_id) if n.native_id == native.native_id
        ]
        if recorded and recorded[0].upstream_id != upstream_id:
            # Another replica recorded its own submission first (this one stalled past its
            # lease): this upstream batch is a second copy of the same lines.
            self.log.warning(
                "batch_native_duplicate", native_id=native.native_id, upstream=upstream_id
            )
            await api.cancel(upstream_id)

    async def _poll(self, batch: BatchRecord, native: NativeBatch) -> None:
        store = self.store.native
        api = self.lines.batch_api(native.provider)
        assert native.upstream_id is not None  # submitted
        if api is None:
            # Its provider left the policy: nothing can read its results any more.
            self.log.error(
                "batch_native_orphaned", native_id=native.native_id, provider=native.provider
            )
            lines = await store.lines(batch.batch_id, native.native_id)
            waiting = [line for line in lines if line.state == "native"]
            await self._end_unrun(batch, native, waiting, "expired")
            return
        try:
            state = await api.poll(native.upstream_id)
        except UpstreamError as exc:
            if exc.upstream_status != 404:
                raise  # tried again at the next poll
            # The provider no longer knows the batch: its lines get the gateway's 502.
            self.log.error("batch_native_lost", native_id=native.native_id, error=str(exc))
            await self._record(batch, native, api, [])
            await store.ended(native.native_id, upstream_status="not_found", now_ms=self.now_ms())
            return
        if not state.ended:
            if native.cancel_sent_ms is None and await self._stopping(batch.batch_id) is not None:
                await api.cancel(native.upstream_id)
                await store.cancel_sent(native.native_id, self.now_ms())
                self.log.info("batch_native_cancel_sent", native_id=native.native_id)
            await store.polled(
                native.native_id,
                self.owner,
                upstream_status=state.status,
                next_poll_ms=self.now_ms() + self.poll_ms,
            )
            return
        await self._record(batch, native, api, await api.results(state))
        await store.ended(native.native_id, upstream_status=state.status, now_ms=self.now_ms())
        self.log.info("batch_native_ended", native_id=native.native_id, status=state.status)

    # -- its results -----------------------------------------------------------------------

    async def _record(
        self, batch: BatchRecord, native: NativeBatch, api: BatchApi, results: list[NativeResult]
    ) -> None:
        lines = await self.store.native.lines(batch.batch_id, native.native_id)
        waiting = {line.custom_id: line for line in lines if line.state == "native"}
        stop = await self._stopping(batch.batch_id)
        answered: list[tuple[NativeLine, NativeResult]] = []
        unrun: list[NativeLine] = []
        unrun_states: list[tuple[int, str]] = []
        for result in results:
            line = waiting.pop(result.custom_id, None)
            if line is None:
                continue  # not one of its lines, or answered already
            if result.outcome == "answered":
                answered.append((line, result))
            else:
                unrun.append(line)
                unrun_states.append((line.index, stop or result.outcome))
        answered += [
            (line, NativeResult(line.custom_id, "answered", 502, NO_RESULT))
            for line in waiting.values()
        ]
        for start in range(0, len(answered), RECORD_CHUNK):
            chunk = answered[start : start + RECORD_CHUNK]
            done = await asyncio.gather(
                *(self._record_one(batch, native, api, line, result) for line, result in chunk)
            )
            await self.store.native.answer(
                batch.batch_id,
                [
                    (line.index, line_answer(result), line_request_id(batch.batch_id, line.index))
                    for (line, _), result in zip(chunk, done, strict=True)
                ],
                self.now_ms(),
            )
        await self.store.native.close(batch.batch_id, unrun_states)
        await self._release(native, unrun)

    async def _record_one(
        self,
        batch: BatchRecord,
        native: NativeBatch,
        api: BatchApi,
        line: NativeLine,
        result: NativeResult,
    ) -> LineResult:
        ok = 200 <= result.status < 300
        outcome = NativeOutcome(
            NativeRoute(native.provider, line.model, self._hold(native, line.index)),
            native_record_id(batch.batch_id, line.index),
            result.status,
            result.body,
            None if ok else api.error(result.status, result.body),
        )
        return await self.lines.record(self._call(batch, line.index, line.body), outcome)

    async def _end_unrun(
        self, batch: BatchRecord, native: NativeBatch, lines: Sequence[NativeLine], state: str
    ) -> None:
        """An upstream batch whose lines will not run: closed ``state``, holds given back."""
        await self.store.native.close(batch.batch_id, [(line.index, state) for line in lines])
        await self._release(native, lines)
        await self.store.native.ended(native.native_id, upstream_status=None, now_ms=self.now_ms())

    async def _give_back(
        self, batch: BatchRecord, native: NativeBatch, lines: Sequence[NativeLine]
    ) -> None:
        """Lines that can no longer go to the provider's batch run through the pipeline."""
        if lines:
            await self.store.native.give_back(batch.batch_id, [line.index for line in lines])
            await self._release(native, lines)
            self.log.info("batch_native_given_back", native_id=native.native_id, lines=len(lines))

    async def _release(self, native: NativeBatch, lines: Sequence[NativeLine]) -> None:
        holds = [self._hold(native, line.index) for line in lines]
        for hold in holds:
            if hold is None:
                continue
            try:
                await self.limiter.release(hold)
            except LimiterUnavailable:  # it lapses at the end of its hold instead
                self.log.warning("batch_native_hold_kept", request_id=hold.request_id)

    def _hold(self, native: NativeBatch, index: int) -> Reservation | None:
        if native.hold_json is None:
            return None
        held = SpooledSettle.from_json(native.hold_json.encode()).reservation
        return dataclasses.replace(held, request_id=hold_id(native.batch_id, index))


def _hold_json(hold: Reservation | None) -> str | None:
    """The budget hold of an upstream batch's lines, as every line's differs only by its id
    (``hold_id``); kept in the format the settle spool keeps a reservation in."""
    return None if hold is None else SpooledSettle("settle", hold).to_json().decode()
