"""The batch store's contract, on SQLite and on PostgreSQL: files in chunks, claims under leases
that two stores (two replicas) share without overlap, a line answered once, a lapsed lease
claimed again, a close taken by one replica at a time."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from gateway.batches.records import (
    BatchRecord,
    FileRecord,
    LineAnswer,
    NewLine,
    derived_file_id,
)
from gateway.batches.store import CHUNK_BYTES, BatchStore

if TYPE_CHECKING:  # the fixture's type: conftest is not imported by name (tests/routing has one)
    from conftest import OpenBatchStore

NOW = 1_800_000_000_000


def _batch(batch_id: str = "batch_1", key_id: str = "k1", **fields: object) -> BatchRecord:
    values: dict[str, object] = {
        "batch_id": batch_id,
        "key_id": key_id,
        "api": "openai",
        "endpoint": "/v1/chat/completions",
        "input_file_id": "file-in",
        "completion_window": "24h",
        "metadata_json": None,
        "status": "validating",
        "created_ms": NOW,
        "expires_ms": int(time.time() * 1000) + 86_400_000,
    }
    values.update(fields)
    return BatchRecord(**values)  # type: ignore[arg-type]


def _lines(count: int) -> list[NewLine]:
    return [NewLine(i, f"c{i}", '{"model":"m"}') for i in range(count)]


def _now() -> int:
    return int(time.time() * 1000)


async def _routed(store: BatchStore, batch_id: str) -> None:
    """Its lines sorted, none native: the pipeline may claim them."""
    await store.native.record_routes(batch_id, [], [], _now())


async def test_files_keep_their_bytes_in_chunks_and_list_by_key(
    open_batch_store: OpenBatchStore,
) -> None:
    store = await open_batch_store()
    data = bytes(range(256)) * (CHUNK_BYTES * 5 // 2 // 256)  # two and a half chunks
    await store.add_file(FileRecord("file-a", "k1", "batch", "a.jsonl", len(data), NOW), data)
    await store.add_file(FileRecord("file-b", "k1", "batch", "b.jsonl", 3, NOW + 1), b"abc")
    await store.add_file(FileRecord("file-c", "k2", "batch", "c.jsonl", 1, NOW + 2), b"x")

    assert await store.file_bytes("file-a") == data
    assert (await store.file("file-a")) == FileRecord(
        "file-a", "k1", "batch", "a.jsonl", len(data), NOW
    )
    first = await store.files("k1", purpose=None, after=None, limit=1)
    assert [f.file_id for f in first.items] == ["file-b"] and first.has_more
    rest = await store.files("k1", purpose=None, after=first.items[0], limit=5)
    assert [f.file_id for f in rest.items] == ["file-a"] and not rest.has_more
    assert await store.delete_file("file-a")
    assert await store.file("file-a") is None and await store.file_bytes("file-a") == b""
    assert not await store.delete_file("file-a")


async def test_two_replicas_claim_disjoint_lines_and_each_line_is_answered_once(
    open_batch_store: OpenBatchStore,
) -> None:
    one, two = await open_batch_store(), await open_batch_store()
    await one.add_batch(_batch())
    assert await one.start("batch_1", _lines(40), _now())
    assert not await two.start("batch_1", _lines(40), _now())  # started once, lines once
    assert await one.claim_lines("batch_1", "x", now_ms=_now(), lease_ms=1, limit=1) == []
    await _routed(two, "batch_1")  # claimed only once sorted
    assert (await one.counts("batch_1")).total == 40

    claims = await asyncio.gather(
        *(
            store.claim_lines("batch_1", owner, now_ms=_now(), lease_ms=60_000, limit=15)
            for store, owner in ((one, "a"), (two, "b"), (one, "a"), (two, "b"))
        )
    )
    assert all(len(claim) <= 15 for claim in claims)
    indexes = [line.index for claim in claims for line in claim]
    assert sorted(indexes) == list(range(40))  # every line claimed, none by both

    line = claims[0][0]
    first = await one.answer("batch_1", line.index, LineAnswer(200, "{}"), "r", _now())
    again = await two.answer("batch_1", line.index, LineAnswer(500, "{}"), "r", _now())
    assert first and not again
    counts = await one.counts("batch_1")
    assert (counts.completed, counts.failed, counts.open) == (1, 0, 39)


async def test_a_lapsed_lease_is_claimed_again_and_a_renewed_one_is_not(
    open_batch_store: OpenBatchStore,
) -> None:
    one, two = await open_batch_store(), await open_batch_store()
    await one.add_batch(_batch())
    await one.start("batch_1", _lines(2), _now())
    await _routed(one, "batch_1")
    dead = await one.claim_lines("batch_1", "dead", now_ms=_now(), lease_ms=50, limit=1)
    alive = await one.claim_lines("batch_1", "alive", now_ms=_now(), lease_ms=50, limit=1)
    assert [dead[0].index, alive[0].index] == [0, 1]
    assert await one.renew("alive", _now() + 60_000) == 1
    await asyncio.sleep(0.1)
    taken = await two.claim_lines("batch_1", "other", now_ms=_now(), lease_ms=60_000, limit=5)
    assert [(line.index, line.tries) for line in taken] == [(0, 2)]
    assert await two.running_lines("batch_1", _now()) == 2
    # The dead holder comes back late: its answer still counts once (the line is open).
    assert await one.answer("batch_1", 0, LineAnswer(200, "{}"), "r", _now())
    assert not await two.answer("batch_1", 0, LineAnswer(200, "{}"), "r", _now())
    assert await two.release("batch_1", 1, "other") is False  # not its line
    assert await one.release("batch_1", 1, "alive")
    assert [
        x.index
        for x in await two.claim_lines("batch_1", "o", now_ms=_now(), lease_ms=1000, limit=5)
    ] == [1]


async def test_a_cancelled_or_expired_batch_gives_no_more_lines(
    open_batch_store: OpenBatchStore,
) -> None:
    store = await open_batch_store()
    await store.add_batch(_batch("batch_c"))
    await store.add_batch(_batch("batch_e"))
    for batch_id in ("batch_c", "batch_e"):
        await store.start(batch_id, _lines(3), _now())
        await _routed(store, batch_id)
    assert await store.cancel("batch_c", _now())
    assert not await store.cancel("batch_c", _now())  # already cancelling
    await store.expire_at("batch_e", _now() - 1)
    for batch_id in ("batch_c", "batch_e"):
        assert await store.claim_lines(batch_id, "a", now_ms=_now(), lease_ms=1000, limit=3) == []
    assert (await store.batch("batch_c")).status == "cancelling"  # type: ignore[union-attr]


async def test_one_replica_closes_a_batch_and_its_files_are_stored_with_it(
    open_batch_store: OpenBatchStore,
) -> None:
    one, two = await open_batch_store(), await open_batch_store()
    await one.add_batch(_batch())
    await one.start("batch_1", _lines(3), _now())
    await _routed(one, "batch_1")
    (line,) = await one.claim_lines("batch_1", "a", now_ms=_now(), lease_ms=60_000, limit=1)
    await one.answer("batch_1", line.index, LineAnswer(200, '{"ok":1}'), "req-0", _now())
    assert await one.cancel("batch_1", _now())

    taken = await one.begin_close(
        "batch_1",
        "a",
        from_status="cancelling",
        to_status="cancelling",
        now_ms=_now(),
        lease_ms=60_000,
    )
    refused = await two.begin_close(
        "batch_1",
        "b",
        from_status="cancelling",
        to_status="cancelling",
        now_ms=_now(),
        lease_ms=60_000,
    )
    assert taken and not refused
    assert await one.close_lines("batch_1", "cancelled") == 2
    counts = await one.counts("batch_1")
    assert (counts.completed, counts.cancelled, counts.open) == (1, 2, 0)
    output = derived_file_id("batch_1", "output")
    record = FileRecord(output, "k1", "batch_output", "out.jsonl", 4, _now())
    assert not await two.finish(
        "batch_1", "b", status="cancelled", now_ms=_now(), counts=counts,
        files=[], output_file_id=None, error_file_id=None,
    )  # fmt: skip
    assert await one.finish(
        "batch_1", "a", status="cancelled", now_ms=_now(), counts=counts,
        files=[(record, b"data")], output_file_id=output, error_file_id=None,
    )  # fmt: skip
    batch = await two.batch("batch_1")
    assert batch is not None
    assert (batch.status, batch.output_file_id, batch.completed, batch.total) == (
        "cancelled", output, 1, 3,
    )  # fmt: skip
    assert batch.cancelled_ms is not None and await two.file_bytes(output) == b"data"
    lines = await two.lines("batch_1")
    assert [(x.state, x.request_id) for x in lines] == [
        ("done", "req-0"), ("cancelled", None), ("cancelled", None),
    ]  # fmt: skip
