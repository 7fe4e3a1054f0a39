"""Typed admin inputs: JSON bodies and query strings checked against pydantic models.

A failure is a 400 in OpenAI's envelope whose ``param`` names the field (``models[2]``,
``limit``). Handlers check everything before they change anything, so a refused request has
applied nothing. Query strings: an unknown parameter is refused, a parameter given twice is
refused, and an empty value is a value (``limit=`` is not a number).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from gateway.errors import InvalidRequest

Model = TypeVar("Model", bound=BaseModel)
_MAX_NAME_CHARS = 100


def field_path(location: tuple[Any, ...]) -> str:
    """pydantic's error location as ``models[2].name`` (validator frames left out)."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not path:
            path = str(part)[:_MAX_NAME_CHARS]
        elif not str(part).startswith(("function-", "constrained-")):
            path += f".{str(part)[:_MAX_NAME_CHARS]}"
    return path


def _invalid(error: ValidationError, unknown: str) -> InvalidRequest:
    first = error.errors(include_input=False, include_url=False)[0]
    path = field_path(first["loc"])
    message = unknown if first["type"] == "extra_forbidden" else first["msg"]
    message = message.removeprefix("Value error, ")
    return InvalidRequest(f"{path}: {message}" if path else message, param=path or None)


def parse_payload(model: type[Model], data: dict[str, Any]) -> Model:
    """A JSON body as ``model``; InvalidRequest naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, "unknown field") from None


def parse_query(model: type[Model], request: Request) -> Model:
    """The query string as ``model`` (its ``extra="forbid"`` refuses unknown parameters)."""
    data: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in data:
            shown = name[:_MAX_NAME_CHARS]
            raise InvalidRequest(f"{shown}: given more than once", param=shown)
        data[name] = value
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc, "unknown query parameter") from None
