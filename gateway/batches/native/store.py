"""``NativeStore``: the upstream batches of ``batch: native`` providers, in the SQL store
beside the gateway's own batches (``batch_natives``, schema version 7 in
``gateway/ledger/batch_tables.py``).

A gateway batch's lines are sorted once (``take_routing`` → ``record_routes``): those whose
route lands on a ``batch: native`` provider in its own format become ``native`` lines of one
upstream batch per provider (a ``NativeBatch`` row, ``submitting``), in the same transaction
that marks the batch routed; the others stay ``pending`` for the pipeline. A row is worked by
one replica at a time under a lease (``take``): submitted once (``submitted`` records the
provider's batch id, the only step that moves it out of ``submitting``), polled every
``next_poll_ms``, and ``ended`` once its results are recorded on its lines (``answer`` and
``close``, which only touch lines still ``native``: each line is answered once).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.batches.records import ClaimedLine, LineAnswer
from gateway.batches.sql import SqlRunner, Step

NativeState = Literal["submitting", "submitted", "ended"]


def native_id_of(batch_id: str, provider: str) -> str:
    """A gateway batch's upstream batch at ``provider``: the same id whichever replica sorts
    the batch's lines, so sorting them twice (after a crash) makes the same row."""
    return "nb_" + hashlib.sha256(f"{batch_id}:{provider}".encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class NativeBatch:
    native_id: str
    batch_id: str
    provider: str
    state: NativeState
    upstream_id: str | None  # the provider's batch id, once submitted
    upstream_status: str | None  # what the provider said of it when last polled
    hold_json: str | None  # the budget hold its lines took (None: the key has no budget)
    lines: int
    tries: int  # submissions begun: above 1, an earlier one may have reached the provider
    owner: str | None
    lease_until_ms: int | None
    next_poll_ms: int
    cancel_sent_ms: int | None = None
    created_ms: int = 0
    submitted_ms: int | None = None
    ended_ms: int | None = None


@dataclass(frozen=True, slots=True)
class NativeLine:
    """A line of an upstream batch: its place, ``custom_id``, body, the model its route
    chose, and its state (``native`` until answered or closed)."""

    index: int
    custom_id: str
    body: str
    model: str
    state: str


_COLUMNS = tuple(field.name for field in dataclasses.fields(NativeBatch))
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM batch_natives"


class NativeStore:
    def __init__(self, sql: SqlRunner) -> None:
        self.sql = sql

    # -- sorting a batch's lines ---------------------------------------------------------

    async def take_routing(self, batch_id: str, owner: str, *, now_ms: int, lease_ms: int) -> bool:
        """Take the sorting of an ``in_progress`` batch's lines unless it is done or another
        replica holds it (its lease not lapsed)."""
        m = self.sql.mark
        (changed,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batches SET router = {m(1)}, router_until_ms = {m(2)}"
                    f" WHERE batch_id = {m(3)} AND status = 'in_progress' AND routed_ms IS NULL"
                    f" AND (router IS NULL OR router = {m(1)} OR router_until_ms < {m(4)})",
                    [owner, now_ms + lease_ms, batch_id, now_ms],
                )
            ]
        )
        return bool(changed)

    async def pending_lines(self, batch_id: str, *, after: int, limit: int) -> list[ClaimedLine]:
        m = self.sql.mark
        rows = await self.sql.rows(
            "SELECT line_index, custom_id, body, tries FROM batch_lines"
            f" WHERE batch_id = {m(1)} AND state = 'pending' AND line_index > {m(2)}"
            f" ORDER BY line_index LIMIT {m(3)}",
            [batch_id, after, limit],
        )
        return [ClaimedLine(batch_id, int(r[0]), r[1], r[2], int(r[3])) for r in rows]

    async def record_routes(
        self,
        batch_id: str,
        natives: Sequence[NativeBatch],
        routes: Sequence[tuple[int, str, str]],
        now_ms: int,
    ) -> None:
        """In one transaction: the upstream batches, their lines (``(index, native_id,
        model)``, still ``pending``) made ``native``, and the batch marked routed."""
        m = self.sql.mark
        steps: list[Step] = []
        if natives:
            steps.append(
                Step(
                    f"INSERT INTO batch_natives ({', '.join(_COLUMNS)})"
                    f" VALUES ({', '.join(m(n + 1) for n in range(len(_COLUMNS)))})"
                    " ON CONFLICT DO NOTHING",
                    [dataclasses.astuple(native) for native in natives],
                    "many",
                )
            )
        if routes:
            steps.append(
                Step(
                    f"UPDATE batch_lines SET state = 'native', native_id = {m(1)},"
                    f" native_model = {m(2)} WHERE batch_id = {m(3)} AND line_index = {m(4)}"
                    " AND state = 'pending'",
                    [(native_id, model, batch_id, index) for index, native_id, model in routes],
                    "many",
                )
            )
        steps.append(
            Step(
                f"UPDATE batches SET routed_ms = COALESCE(routed_ms, {m(1)}), router = NULL,"
                f" router_until_ms = NULL WHERE batch_id = {m(2)}",
                [now_ms, batch_id],
            )
        )
        await self.sql.run(steps)

    # -- working an upstream batch -------------------------------------------------------

    async def natives(self, batch_id: str) -> list[NativeBatch]:
        rows = await self.sql.rows(
            f"{_SELECT} WHERE batch_id = {self.sql.mark(1)} ORDER BY native_id", [batch_id]
        )
        return [NativeBatch(*row) for row in rows]

    async def open_count(self, batch_id: str) -> int:
        """Upstream batches of the batch that have not ended (its close waits for them)."""
        m = self.sql.mark
        rows = await self.sql.rows(
            f"SELECT count(*) FROM batch_natives WHERE batch_id = {m(1)} AND state <> 'ended'",
            [batch_id],
        )
        return int(rows[0][0])

    async def take(
        self, native_id: str, owner: str, *, now_ms: int, lease_ms: int
    ) -> NativeBatch | None:
        """Lease a row that is due (``next_poll_ms``) and not ended unless another replica
        holds it; a submission begun counts in ``tries``."""
        m = self.sql.mark
        (rows,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batch_natives SET owner = {m(1)}, lease_until_ms = {m(2)},"
                    " tries = tries + CASE WHEN state = 'submitting' THEN 1 ELSE 0 END"
                    f" WHERE native_id = {m(3)} AND state <> 'ended' AND next_poll_ms <= {m(4)}"
                    f" AND (owner IS NULL OR owner = {m(1)} OR lease_until_ms < {m(4)})"
                    f" RETURNING {', '.join(_COLUMNS)}",
                    [owner, now_ms + lease_ms, native_id, now_ms],
                    "rows",
                )
            ]
        )
        return NativeBatch(*rows[0]) if rows else None

    async def submitted(
        self, native_id: str, upstream_id: str, *, now_ms: int, next_poll_ms: int
    ) -> bool:
        """Record the provider's batch id: the one step out of ``submitting``. False: another
        replica recorded one first (``natives`` shows which)."""
        m = self.sql.mark
        (changed,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batch_natives SET state = 'submitted', upstream_id = {m(1)},"
                    f" submitted_ms = {m(2)}, next_poll_ms = {m(3)}, owner = NULL,"
                    f" lease_until_ms = NULL WHERE native_id = {m(4)} AND state = 'submitting'",
                    [upstream_id, now_ms, next_poll_ms, native_id],
                )
            ]
        )
        return bool(changed)

    async def polled(
        self, native_id: str, owner: str, *, upstream_status: str | None, next_poll_ms: int
    ) -> None:
        """Give the row back until its next poll."""
        m = self.sql.mark
        await self.sql.run(
            [
                Step(
                    f"UPDATE batch_natives SET upstream_status = COALESCE({m(1)}, upstream_status),"
                    f" next_poll_ms = {m(2)}, owner = NULL, lease_until_ms = NULL"
                    f" WHERE native_id = {m(3)} AND owner = {m(4)}",
                    [upstream_status, next_poll_ms, native_id, owner],
                )
            ]
        )

    async def cancel_sent(self, native_id: str, now_ms: int) -> None:
        m = self.sql.mark
        await self.sql.run(
            [
                Step(
                    f"UPDATE batch_natives SET cancel_sent_ms = {m(1)} WHERE native_id = {m(2)}",
                    [now_ms, native_id],
                )
            ]
        )

    async def ended(self, native_id: str, *, upstream_status: str | None, now_ms: int) -> bool:
        m = self.sql.mark
        (changed,) = await self.sql.run(
            [
                Step(
                    f"UPDATE batch_natives SET state = 'ended', ended_ms = {m(1)},"
                    f" upstream_status = COALESCE({m(2)}, upstream_status), owner = NULL,"
                    f" lease_until_ms = NULL WHERE native_id = {m(3)} AND state <> 'ended'",
                    [now_ms, upstream_status, native_id],
                )
            ]
        )
        return bool(changed)

    def renew_step(self, owner: str, until_ms: int) -> Step:
        m = self.sql.mark
        return Step(
            f"UPDATE batch_natives SET lease_until_ms = {m(1)}"
            f" WHERE owner = {m(2)} AND state <> 'ended'",
            [until_ms, owner],
        )

    # -- its lines -----------------------------------------------------------------------

    async def lines(self, batch_id: str, native_id: str) -> list[NativeLine]:
        m = self.sql.mark
        rows = await self.sql.rows(
            "SELECT line_index, custom_id, body, native_model, state FROM batch_lines"
            f" WHERE batch_id = {m(1)} AND native_id = {m(2)} ORDER BY line_index",
            [batch_id, native_id],
        )
        return [NativeLine(int(r[0]), r[1], r[2], r[3], r[4]) for r in rows]

    async def answer(
        self, batch_id: str, answers: Sequence[tuple[int, LineAnswer, str]], now_ms: int
    ) -> None:
        """Record ``(index, answer, request_id)`` on lines still ``native``, in one
        transaction; a line answered already keeps its answer."""
        if not answers:
            return
        m = self.sql.mark
        await self.sql.run(
            [
                Step(
                    f"UPDATE batch_lines SET state = 'done', status_code = {m(1)},"
                    f" response = {m(2)}, request_id = {m(3)}, done_ms = {m(4)}"
                    f" WHERE batch_id = {m(5)} AND line_index = {m(6)} AND state = 'native'",
                    [
                        (answer.status_code, answer.response, request_id, now_ms, batch_id, index)
                        for index, answer, request_id in answers
                    ],
                    "many",
                )
            ]
        )

    async def close(self, batch_id: str, closed: Sequence[tuple[int, str]]) -> None:
        """Close ``(index, state)`` lines still ``native`` unanswered (``cancelled`` or
        ``expired``)."""
        if not closed:
            return
        m = self.sql.mark
        await self.sql.run(
            [
                Step(
                    f"UPDATE batch_lines SET state = {m(1)} WHERE batch_id = {m(2)}"
                    f" AND line_index = {m(3)} AND state = 'native'",
                    [(state, batch_id, index) for index, state in closed],
                    "many",
                )
            ]
        )

    async def give_back(self, batch_id: str, indexes: Sequence[int]) -> None:
        """Lines that can no longer go to their provider's batch (the policy changed): back to
        ``pending``, for the pipeline."""
        if not indexes:
            return
        m = self.sql.mark
        await self.sql.run(
            [
                Step(
                    "UPDATE batch_lines SET state = 'pending', native_id = NULL,"
                    f" native_model = NULL WHERE batch_id = {m(1)} AND line_index = {m(2)}"
                    " AND state = 'native'",
                    [(batch_id, index) for index in indexes],
                    "many",
                )
            ]
        )
