"""The refusals the admin operations (keys, teams, admin tokens) share when a record is not
there: a missing record is the 404 naming the id asked for, and a page after an id that no
record has is the 400 naming ``after``."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from gateway.errors import InvalidRequest, NotFound

T = TypeVar("T")


def missing(kind: str, record_id: str) -> NotFound:
    """The 404 for ``kind`` (``key``, ``team``, ``admin token``) with this id."""
    return NotFound(f"no {kind} with id {record_id!r}", param="id")


def found(record: T | None, kind: str, record_id: str) -> T:
    """``record``, or the 404 naming ``record_id`` when there is none."""
    if record is None:
        raise missing(kind, record_id)
    return record


async def page_after(listing: Awaitable[T], kind: str) -> T:
    """A store's page of records; its ``KeyError`` (no such ``after`` id) is the 400."""
    try:
        return await listing
    except KeyError:
        raise InvalidRequest(f"after: no {kind} with that id", param="after") from None
