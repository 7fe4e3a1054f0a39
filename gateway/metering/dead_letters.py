"""Usage the store could not keep: what the exporter turns into dead letters, and their replay.

``decode_entry`` reads one buffer payload as the store's event, or says why it cannot be one.
``store_apart`` inserts a batch; when the store refuses it for its data (``UsageStore.refuses``,
not an outage), it inserts the halves apart, down to the single events the store refuses,
which come back as dead letters; the rest is stored. An outage stays an exception for the
caller to retry. ``DeadLetters`` lists the letters (``gateway.ledger.dead_letters``) and
replays them once the cause is fixed: with the store fixed as they are, or with
``corrections`` for a label recorded before the entry points checked it (a key's team with a
tab in it, say), checked by the ledger's rule like any event. A replayed letter that is stored
goes; one the store still refuses stays, with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import orjson

from gateway.ledger import UsageEvent, UsageStore
from gateway.ledger.dead_letters import DeadLetter, DeadLetterQuery, DeadLetterView, LetterId
from gateway.ledger.record import RecordError

# The labels a replay may correct: those an old entry point let through unchecked.
CORRECTABLE = ("team", "task", "route", "end_user", "tags", "model", "provider", "policy_version")

Pair = tuple[UsageEvent, bytes]


class DeadLetterList(TypedDict):
    object: Literal["list"]
    data: list[DeadLetterView]
    next_cursor: str | None
    total: int


class RefusedLetter(TypedDict):
    id: LetterId
    reason: str


class DeadLettersReplayed(TypedDict):
    object: Literal["usage_dead_letter_replay"]
    replayed: list[LetterId]
    inserted: int
    refused: list[RefusedLetter]
    remaining: int


def now_ms() -> int:
    return int(time.time() * 1000)


def decode_entry(
    payload: bytes,
    corrections: Mapping[str, Any] | None = None,
    *,
    known: UsageEvent | None = None,
) -> UsageEvent | DeadLetter:
    """The event of one buffer payload, within the store's bounds, or the dead letter saying
    why it has none. ``known``: the event ``payload`` is the JSON of (``RecentEvents``), which
    is then only checked against the store's bounds, not decoded again."""
    try:
        if known is not None and not corrections:
            event = known
        elif corrections:
            data = orjson.loads(payload)
            if not isinstance(data, dict):
                raise UsageEvent.error("event", "must be a JSON object")
            event = UsageEvent.from_dict({**data, **corrections})
        else:
            event = UsageEvent.from_json(payload)
        event.check_storable()
        return event
    except orjson.JSONDecodeError as exc:
        return DeadLetter.of(
            payload, field="event", reason=f"invalid JSON: {exc}", failed_ms=now_ms()
        )
    except RecordError as exc:
        return DeadLetter.of(payload, field=exc.field, reason=str(exc), failed_ms=now_ms())


async def store_apart(store: UsageStore, pairs: Sequence[Pair]) -> tuple[int, list[DeadLetter]]:
    """Insert the events of ``pairs`` (event, payload); returns how many were new and the dead
    letters of those the store refused. Raises what ``insert`` raised when it is not a
    refusal of the data (the store is away: retry later)."""
    try:
        return await store.insert([event for event, _ in pairs]), []
    except Exception as exc:
        if not store.refuses(exc):
            raise
        if len(pairs) == 1:
            reason = f"the store refused it: {type(exc).__name__}: {exc}"
            return 0, [DeadLetter.of(pairs[0][1], field="store", reason=reason, failed_ms=now_ms())]
    middle = len(pairs) // 2
    first, first_letters = await store_apart(store, pairs[:middle])
    second, second_letters = await store_apart(store, pairs[middle:])
    return first + second, first_letters + second_letters


@dataclass(eq=False)
class DeadLetters:
    """The dead letters of one usage store, for the admin API."""

    store: UsageStore

    async def page(self, limit: int = 100, cursor: str | None = None) -> DeadLetterList:
        """One page, oldest first (raises ``LedgerQueryError`` naming a bad parameter)."""
        page = await self.store.dead_letters(DeadLetterQuery(limit=limit, cursor=cursor))
        return {
            "object": "list",
            "data": [letter.view() for letter in page.letters],
            "next_cursor": page.next_cursor,
            "total": await self.store.count_dead_letters(),
        }

    async def replay(
        self,
        ids: Sequence[str] | None = None,
        corrections: Mapping[str, Any] | None = None,
        limit: int = 500,
    ) -> DeadLettersReplayed:
        """Store the letters ``ids`` (default: the oldest ``limit``), each with ``corrections``
        applied; those stored are dropped. Store outages raise, leaving every letter kept."""
        query = DeadLetterQuery(limit=limit, ids=tuple(ids) if ids is not None else None)
        letters = (await self.store.dead_letters(query)).letters
        pairs: list[Pair] = []
        ids_of: dict[bytes, str] = {}
        refused: list[RefusedLetter] = []
        for letter in letters:
            decoded = decode_entry(letter.payload, corrections)
            if isinstance(decoded, DeadLetter):
                refused.append({"id": letter.letter_id, "reason": decoded.reason})
            else:
                pairs.append((decoded, letter.payload))
                ids_of[letter.payload] = letter.letter_id
        inserted, still = await store_apart(self.store, pairs) if pairs else (0, [])
        refused += [{"id": ids_of[letter.payload], "reason": letter.reason} for letter in still]
        refused_ids = {item["id"] for item in refused}
        stored = [ids_of[payload] for _, payload in pairs if ids_of[payload] not in refused_ids]
        await self.store.drop_dead_letters(stored)
        return {
            "object": "usage_dead_letter_replay",
            "replayed": stored,
            "inserted": inserted,
            "refused": refused,
            "remaining": await self.store.count_dead_letters(),
        }
