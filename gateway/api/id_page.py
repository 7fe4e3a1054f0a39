"""A page of a list answer that pages by id (OpenAI's files, batches and keys; Anthropic's
message batches): whether more follow, and the first and last ids of this page, which the
client passes back as ``after`` (or ``before_id``) to go on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict


class IdPage(TypedDict):
    has_more: bool
    first_id: str | None
    last_id: str | None


def id_page(data: Sequence[Mapping[str, Any]], has_more: bool) -> IdPage:
    return IdPage(
        has_more=has_more,
        first_id=data[0]["id"] if data else None,
        last_id=data[-1]["id"] if data else None,
    )
