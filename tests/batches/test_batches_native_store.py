"""The native lines' store contract, on SQLite and PostgreSQL: a batch's lines sorted once
(one replica at a time, under a lease), native lines never claimed by the pipeline, an upstream
batch worked by one replica at a time, its provider id recorded once, its lines answered once,
given back to the pipeline, or closed unanswered."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.batches.native.store import NativeBatch, native_id_of
from gateway.batches.records import BatchRecord, LineAnswer, NewLine

if TYPE_CHECKING:  # the fixture's type: conftest is not imported by name (tests/routing has one)
    from conftest import OpenBatchStore

NOW = 1_800_000_000_000


def _now() -> int:
    return int(time.time() * 1000)


def _batch() -> BatchRecord:
    return BatchRecord(
        "batch_n", "k1", "openai", "/v1/chat/completions", "file-in", "24h", None,
        "validating", NOW, _now() + 86_400_000,
    )  # fmt: skip


def _native(native_id: str, lines: int) -> NativeBatch:
    return NativeBatch(
        native_id, "batch_n", "openai", "submitting", None, None, None, lines, 0, None, None,
        next_poll_ms=0, created_ms=_now(),
    )  # fmt: skip


async def test_native_lines_are_sorted_once_worked_by_one_replica_and_answered_once(
    open_batch_store: OpenBatchStore,
) -> None:
    one, two = await open_batch_store(), await open_batch_store()
    await one.add_batch(_batch())
    lines = [NewLine(i, f"c{i}", '{"model":"m"}') for i in range(6)]
    assert await one.start("batch_n", lines, _now())

    assert await one.native.take_routing("batch_n", "a", now_ms=_now(), lease_ms=60_000)
    assert not await two.native.take_routing("batch_n", "b", now_ms=_now(), lease_ms=60_000)
    pending = await one.native.pending_lines("batch_n", after=-1, limit=4)
    assert [line.index for line in pending] == [0, 1, 2, 3]
    native_id = native_id_of("batch_n", "openai")
    assert native_id == native_id_of("batch_n", "openai") != native_id_of("batch_n", "other")
    routes = [(i, native_id, "gpt") for i in (0, 1, 2, 3)]
    await one.native.record_routes("batch_n", [_native(native_id, 4)], routes, _now())
    await two.native.record_routes("batch_n", [_native(native_id, 4)], routes, _now())  # again
    assert (await one.batch("batch_n")).routed_ms is not None  # type: ignore[union-attr]
    assert not await one.native.take_routing("batch_n", "a", now_ms=_now(), lease_ms=60_000)
    claimed = await two.claim_lines("batch_n", "p", now_ms=_now(), lease_ms=60_000, limit=10)
    assert [line.index for line in claimed] == [4, 5]  # the pipeline's: never a native one
    assert (await one.counts("batch_n")).open == 6

    taken = await one.native.take(native_id, "a", now_ms=_now(), lease_ms=60_000)
    assert taken is not None and (taken.tries, taken.owner) == (1, "a")
    assert await two.native.take(native_id, "b", now_ms=_now(), lease_ms=60_000) is None
    assert await two.renew("a", _now() + 120_000) == 1  # the upstream batch's lease
    assert await one.native.submitted(native_id, "up-1", now_ms=_now(), next_poll_ms=0)
    assert not await two.native.submitted(native_id, "up-2", now_ms=_now(), next_poll_ms=0)
    (row,) = await two.native.natives("batch_n")
    assert (row.state, row.upstream_id, row.owner) == ("submitted", "up-1", None)
    polled = await two.native.take(native_id, "b", now_ms=_now(), lease_ms=60_000)
    assert polled is not None and polled.tries == 1  # a poll is no submission
    await two.native.polled(
        native_id, "b", upstream_status="in_progress", next_poll_ms=_now() + 60_000
    )
    assert await one.native.take(native_id, "a", now_ms=_now(), lease_ms=60_000) is None  # not due

    await one.native.give_back("batch_n", [3])
    answer = LineAnswer(200, '{"ok":1}')
    await one.native.answer("batch_n", [(0, answer, "r0")], _now())
    await two.native.answer(
        "batch_n", [(0, LineAnswer(500, "{}"), "r0"), (1, answer, "r1")], _now()
    )
    await one.native.close("batch_n", [(1, "expired"), (2, "cancelled")])
    assert not await one.answer("batch_n", 2, answer, "r2", _now())  # closed: answered never
    assert await one.native.open_count("batch_n") == 1
    assert await one.native.ended(native_id, upstream_status="completed", now_ms=_now())
    assert not await two.native.ended(native_id, upstream_status="completed", now_ms=_now())
    assert await one.native.open_count("batch_n") == 0
    states = [(line.index, line.state, line.status_code) for line in await one.lines("batch_n")]
    assert states == [
        (0, "done", 200), (1, "done", 200), (2, "cancelled", None), (3, "pending", None),
        (4, "leased", None), (5, "leased", None),
    ]  # fmt: skip
    again = await one.claim_lines("batch_n", "q", now_ms=_now() + 120_000, lease_ms=1, limit=10)
    assert [line.index for line in again] == [3, 4, 5]  # the given-back line runs in the pipeline
    await one.delete_batch("batch_n")
    assert await two.native.natives("batch_n") == []
