"""Who a request's cost is attributed to, besides its key: the end user and the tags.

``take_attribution`` reads them from a /v1 body and its headers, validates them, and removes
the gateway's own field (``metadata.tags``) from the body, because providers refuse it (OpenAI
takes only string metadata values, Anthropic only ``metadata.user_id``).

- End user: the ``x-switchyard-user`` header, else the body's ``user`` (OpenAI formats), else
  ``metadata.user_id`` (Anthropic's). The header wins: it is how a backend that calls on its
  users' behalf names them without touching the body. At most 200 printable characters.
- Tags: ``metadata.tags`` (a list of strings, or one comma-separated string) together with the
  ``x-switchyard-tags`` header (comma-separated); when the request names none, the key's
  default tags. At most ``MAX_TAGS`` of 1 to 64 characters of letters, digits and
  ``- _ . : / = @``; a tag named twice counts once (a request counts once in each tag's totals).

A bad value is a 400 naming the field it came from, before the request is routed, so a refused
request leaves no usage event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest
from gateway.ledger.event import clean_tags
from gateway.ledger.record import label_problem

USER_HEADER = "x-switchyard-user"
TAGS_HEADER = "x-switchyard-tags"
# A batch's lines carry the tag ``batch:<batch id>`` beside their own (docs/batches.md).
BATCH_TAG_PREFIX = "batch:"


def batch_tag(batch_id: str) -> str:
    return BATCH_TAG_PREFIX + batch_id


@dataclass(frozen=True, slots=True)
class Attribution:
    end_user: str = ""
    tags: tuple[str, ...] = ()


NOBODY = Attribution()


def take_attribution(
    body: dict[str, Any], headers: Mapping[str, str], key_tags: Sequence[str] | None
) -> Attribution:
    """The request's end user and tags (see the module's docstring); ``metadata.tags`` is
    removed from ``body``. Raises ``InvalidRequest`` naming the field."""
    tags = _request_tags(body, headers) or tuple(key_tags or ())
    return Attribution(end_user=_end_user(body, headers), tags=tags)


def _request_tags(body: dict[str, Any], headers: Mapping[str, str]) -> tuple[str, ...]:
    from_body: list[Any] = []
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and "tags" in metadata:
        listed = metadata.pop("tags")
        if not metadata:
            del body["metadata"]
        if isinstance(listed, str):
            from_body = _split(listed)
        elif isinstance(listed, list):
            from_body = listed
        else:
            raise InvalidRequest(
                "metadata.tags: must be a list of strings or one comma-separated string",
                param="metadata.tags",
            )
    from_header = _split(headers.get(TAGS_HEADER, ""))
    tags = _checked_tags(from_body, "metadata.tags") + _checked_tags(from_header, TAGS_HEADER)
    return _checked_tags(tags, f"metadata.tags with {TAGS_HEADER}", param="metadata.tags")


def _checked_tags(values: Sequence[Any], field: str, param: str | None = None) -> tuple[str, ...]:
    try:
        return clean_tags(values, field)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=param or field) from None


def _split(text: str) -> list[str]:
    return [part for part in text.split(",") if part.strip()]


def _end_user(body: dict[str, Any], headers: Mapping[str, str]) -> str:
    header = headers.get(USER_HEADER)
    if header is not None:
        return _checked_user(header.strip(), USER_HEADER)
    user = body.get("user")
    if user is not None:
        return _checked_user(user, "user")
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("user_id") is not None:
        return _checked_user(metadata["user_id"], "metadata.user_id")
    return ""


def _checked_user(value: Any, field: str) -> str:
    """The end user under the ledger's label rule (``label_problem``), else a 400."""
    problem = label_problem(value)
    if problem is not None:
        raise InvalidRequest(f"{field}: {problem}", param=field)
    return value
