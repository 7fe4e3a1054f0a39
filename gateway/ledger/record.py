"""What every checked usage-event record shares: its error, field checks and strict JSON.

A record is a frozen dataclass that checks its fields in ``__post_init__`` and raises its own
``RecordError`` subclass (``error``) naming the bad field. ``JsonRecord`` gives it ``to_dict`` /
``to_json`` and a strict ``from_dict`` / ``from_json``: an unknown or missing field is refused,
never ignored. The checks here are the ones whose rules do not depend on the store behind the
record (ids, the request's outcome); bounds that do (a 64-bit column) stay with each record.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self, TypeVar

import orjson

USAGE_SOURCES = ("provider", "estimated", "cache")
MAX_ID_LENGTH = 200
MAX_LABEL_LENGTH = MAX_ID_LENGTH


class RecordError(ValueError):
    """A record refused; ``field`` names the offending attribute."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def check_id(error: type[RecordError], field: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise error(field, "must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise error(field, f"longer than {MAX_ID_LENGTH} characters")
    # Braces would break a Redis cluster hash tag; whitespace and control characters have no
    # place in ids. The one printable whitespace character is the space (every other one is
    # not printable), so whole-string tests in C do what a loop over characters would.
    if not value.isprintable() or " " in value or "{" in value or "}" in value:
        raise error(field, "contains braces, whitespace or control characters")


def label_problem(value: object) -> str | None:
    """Why ``value`` cannot be a label of a usage event (a team, task, route, model, provider,
    end user, or a name that ends up beside one), or None if it can. The one rule for every
    label: the ledger refuses an event that breaks it, and every place a label enters (admin
    API, CLI, dashboard, a /v1 request) refuses it first with a 400 naming the field, so no
    answered request's usage is refused by the store later."""
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > MAX_LABEL_LENGTH:
        return f"must be at most {MAX_LABEL_LENGTH} characters"
    # Printable: no control, format or separator characters; the one whitespace allowed is
    # the space.
    if not value.isprintable():
        return "must not contain control characters (tabs, newlines, other non-printables)"
    return None


def check_label(error: type[RecordError], field: str, value: object) -> None:
    """Raise ``error`` naming ``field`` if ``value`` breaks the label rule (``label_problem``)."""
    problem = label_problem(value)
    if problem is not None:
        raise error(field, problem)


def check_outcome(
    error: type[RecordError], status: object, streamed: object, usage_source: object
) -> None:
    """The request's HTTP status, whether it streamed, and where its token counts came from."""
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise error("status", "must be an HTTP status code")
    if not isinstance(streamed, bool):
        raise error("streamed", "must be a boolean")
    if usage_source not in USAGE_SOURCES:
        raise error("usage_source", f"must be one of {', '.join(USAGE_SOURCES)}")


class JsonRecord:
    """Mixin of a frozen dataclass record: a dict and JSON round trip that refuses what does
    not fit. ``from_json`` goes through ``from_dict``, so a record that upgrades old data
    overrides only ``from_dict`` (and builds with ``build_strictly``)."""

    __slots__ = ()
    error: ClassVar[type[RecordError]] = RecordError

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return build_strictly(cls, data)

    @classmethod
    def from_json(cls, raw: bytes | str) -> Self:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise cls.error("event", f"invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise cls.error("event", "must be a JSON object")
        return cls.from_dict(data)


R = TypeVar("R", bound=JsonRecord)


def build_strictly(record_type: type[R], data: dict[str, Any]) -> R:
    """The record of exactly these fields: an unknown one or a missing required one is refused."""
    try:
        return record_type(**data)
    except TypeError as exc:  # an unknown field (refused before any check runs) or a missing one
        names = {field.name for field in dataclasses.fields(record_type)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise record_type.error(unknown[0], "unknown field") from None
        raise record_type.error("event", str(exc)) from exc
