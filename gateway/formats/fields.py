"""Typed reads of JSON fields that fail with ``MalformedRequest`` naming the field's path.

``path`` arguments are the full path of the field read (``messages[2].content``); ``at`` joins
a parent path and a key or index. Absent and ``null`` are the same for optional fields, as in
every format handled here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from gateway.formats.errors import MalformedRequest, UpstreamProtocolError


def at(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


def load_object(body: bytes | str | dict[str, Any], what: str = "request body") -> dict[str, Any]:
    """A JSON object from bytes, text or an already parsed body."""
    if isinstance(body, dict):
        return body
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MalformedRequest(f"the {what} is not valid JSON") from None
    if not isinstance(data, dict):
        raise MalformedRequest(f"the {what} must be a JSON object")
    return data


def load_upstream(body: bytes | str | dict[str, Any], what: str) -> dict[str, Any]:
    """The same for an upstream's body: a failure is the upstream's fault (502), not the client's."""
    try:
        return load_object(body, what)
    except MalformedRequest as exc:
        raise UpstreamProtocolError(f"upstream {exc.message}") from None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def required(parent: dict[str, Any], key: str, path: str) -> Any:
    value = parent.get(key)
    if value is None:
        raise MalformedRequest(f"{path} is required", param=path)
    return value


def obj(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedRequest(f"{path} must be an object", param=path)
    return value


def array(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedRequest(f"{path} must be an array", param=path)
    return value


def string(value: Any, path: str, *, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise MalformedRequest(f"{path} must be a string", param=path)
    if non_empty and not value:
        raise MalformedRequest(f"{path} must not be empty", param=path)
    return value


def required_str(parent: dict[str, Any], key: str, path: str, *, non_empty: bool = False) -> str:
    return string(required(parent, key, path), path, non_empty=non_empty)


def required_obj(parent: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    return obj(required(parent, key, path), path)


def objects(value: Any, path: str) -> Iterator[tuple[dict[str, Any], str]]:
    """The items of an array, each checked to be an object, with its path."""
    for index, item in enumerate(array(value, path)):
        item_path = at(path, index)
        yield obj(item, item_path), item_path


def opt_obj(parent: dict[str, Any], key: str, path: str) -> dict[str, Any] | None:
    value = parent.get(key)
    return None if value is None else obj(value, path)


def opt_array(parent: dict[str, Any], key: str, path: str) -> list[Any]:
    """An optional list; absent or ``null`` reads as empty."""
    value = parent.get(key)
    return [] if value is None else array(value, path)


def opt_str(parent: dict[str, Any], key: str, path: str) -> str | None:
    value = parent.get(key)
    return None if value is None else string(value, path)


def opt_bool(parent: dict[str, Any], key: str, path: str) -> bool | None:
    return _opt_valid(parent, key, path, lambda value: isinstance(value, bool), "a boolean")


def opt_int(parent: dict[str, Any], key: str, path: str, low: int, high: int) -> int | None:
    return _opt_valid(
        parent, key, path, _within(is_int, low, high), f"an integer from {low} to {high}"
    )


def opt_number(
    parent: dict[str, Any], key: str, path: str, low: float, high: float
) -> float | None:
    return _opt_valid(
        parent, key, path, _within(is_number, low, high), f"a number from {low:g} to {high:g}"
    )


def opt_choice(parent: dict[str, Any], key: str, path: str, choices: tuple[str, ...]) -> str | None:
    return _opt_valid(
        parent, key, path, lambda value: value in choices, f"one of: {', '.join(choices)}"
    )


def _opt_valid(
    parent: dict[str, Any], key: str, path: str, valid: Callable[[Any], bool], what: str
) -> Any:
    """``parent[key]``, None when absent; a value that is not ``valid`` fails as not ``what``."""
    value = parent.get(key)
    if value is None or valid(value):
        return value
    raise MalformedRequest(f"{path} must be {what}", param=path)


def _within(is_kind: Callable[[Any], bool], low: float, high: float) -> Callable[[Any], bool]:
    return lambda value: is_kind(value) and low <= value <= high


def string_map(value: Any, path: str) -> dict[str, str]:
    mapping = obj(value, path)
    for key, item in mapping.items():
        string(item, at(path, key))
    return mapping


def json_object_text(arguments: str, path: str) -> dict[str, Any]:
    """Tool-call arguments (JSON text) as the object that formats with structured input need."""
    if not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise MalformedRequest(f"the arguments of {path} are not a JSON object", param=path)
    return value


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def upstream_int(parent: dict[str, Any], key: str, what: str) -> int:
    """A non-negative token count from an upstream body; absent counts as 0."""
    value = parent.get(key)
    if value is None:
        return 0
    if not is_int(value) or value < 0:
        raise UpstreamProtocolError(f"upstream {what}.{key} is not a token count")
    return value
