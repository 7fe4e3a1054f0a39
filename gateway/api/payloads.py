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

from gateway.errors import InvalidRequest, invalid_input

Model = TypeVar("Model", bound=BaseModel)
_MAX_NAME_CHARS = 100


def parse_payload(model: type[Model], data: dict[str, Any]) -> Model:
    """A JSON body as ``model``; InvalidRequest naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc, "unknown field") from None


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
        raise invalid_input(exc, "unknown query parameter") from None
