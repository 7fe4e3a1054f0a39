"""``GET /openapi.json``: an OpenAPI 3.1 description of every endpoint, /v1 and /admin,
generated from the app's routes and the models that validate their input.

Each route the app serves (bar the dashboard's HTML pages) is described by its entry in
``operations.py``: path parameters come from the route, query parameters and bodies from
the pydantic and msgspec models that check them (``models.py``) or, for the bodies parsed
in code, from ``unmodelled.py``; answers from the ``TypedDict`` their builder returns (or
the model, where one defines them). Credentials follow from the path (/v1: an API key as bearer or
``x-api-key``; /admin: an admin credential). Errors are in OpenAI's envelope
(``errors.py`` ``ErrorEnvelope``), Anthropic's on /v1/messages (``AnthropicErrorEnvelope``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import JSON
from gateway.api.openapi.batches import BATCH_OPERATIONS, BATCH_SCHEMAS
from gateway.api.openapi.models import (
    COMPONENTS,
    Schema,
    model_components,
    query_parameters,
    ref,
)
from gateway.api.openapi.operations import (
    ADMIN_ERROR_REASONS,
    ADMIN_ERRORS,
    ERROR_REASONS,
    OPERATIONS,
    PATH_PARAMETERS,
    UNDOCUMENTED_PREFIX,
    Content,
    Operation,
)
from gateway.api.openapi.unmodelled import UNMODELLED
from gateway.errors import ErrorEnvelope
from gateway.formats.anthropic_messages.errors import AnthropicErrorEnvelope
from gateway.services import Services

SECURITY_SCHEMES = {
    "apiKey": {"type": "http", "scheme": "bearer", "description": "sk-sy-... key"},
    "anthropicKey": {
        "type": "apiKey",
        "in": "header",
        "name": "x-api-key",
        "description": "the same sk-sy-... key, as Anthropic's SDKs send it",
    },
    "adminKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "the admin key, or a named admin token (sy-tok-...) whose role reaches "
        "the operation's: viewer (usage reports), operator (keys, teams, reading the policy), "
        "admin (everything)",
    },
}


class _Shapes:
    """Turns the shapes of ``operations.py`` and ``unmodelled.py`` into schemas: a
    model class becomes a reference to its component, and is kept for generating it."""

    def __init__(self) -> None:
        self.models: list[type] = []

    def schema(self, shape: Any) -> Any:
        if isinstance(shape, type):
            self.models.append(shape)
            return ref(shape.__name__)
        if isinstance(shape, str):
            return ref(shape)
        return self.within(shape)

    def within(self, value: Any) -> Any:
        """``value`` with every model class in it turned into a reference."""
        if isinstance(value, type):
            return self.schema(value)
        if isinstance(value, dict):
            return {word: self.within(sub) for word, sub in value.items()}
        if isinstance(value, list):
            return [self.within(sub) for sub in value]
        return value

    def content(self, content: Content) -> dict[str, Any]:
        return {media: {"schema": self.schema(shape)} for media, shape in content.items()}


def _path_parameters(route: Route) -> list[Schema]:
    kinds = {"IntegerConvertor": "integer", "FloatConvertor": "number"}
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": kinds.get(type(convertor).__name__, "string")},
        }
        | ({"description": PATH_PARAMETERS[name]} if name in PATH_PARAMETERS else {})
        for name, convertor in route.param_convertors.items()
    ]


def _operation(route: Route, entry: Operation, shapes: _Shapes) -> dict[str, Any]:
    path = route.path_format
    admin = path.startswith("/admin")
    envelope = AnthropicErrorEnvelope if path.startswith("/v1/messages") else ErrorEnvelope
    errors = set(entry.errors if entry.errors is not None else ADMIN_ERRORS if admin else ())
    if entry.body is not None:
        errors.add(413)  # a body over the size limit
    responses = {
        str(entry.status): {
            "description": HTTPStatus(entry.status).phrase,
            "content": shapes.content(entry.answer),
        }
    }
    for status, (description, content) in entry.also.items():
        responses[str(status)] = {"description": description, "content": shapes.content(content)}
    reasons = ADMIN_ERROR_REASONS if admin else ERROR_REASONS
    for status in sorted(errors):
        responses[str(status)] = {
            "description": reasons[status],
            "content": {"application/json": {"schema": shapes.schema(envelope)}},
        }
    operation: dict[str, Any] = {
        "summary": entry.summary,
        "tags": ["admin" if admin else "v1" if path.startswith("/v1") else "ops"],
    }
    if admin:
        operation["security"] = [{"adminKey": []}]
    elif path.startswith("/v1"):
        operation["security"] = [{"apiKey": []}, {"anthropicKey": []}]
    parameters = _path_parameters(route)
    if entry.query is not None:
        parameters += query_parameters(entry.query)
    parameters += entry.parameters
    if parameters:
        operation["parameters"] = parameters
    if entry.body is not None:
        operation["requestBody"] = {"required": True, "content": shapes.content(entry.body)}
    return operation | {"responses": responses}


def _references(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        if isinstance(value.get("$ref"), str):
            yield value["$ref"]
        for sub in value.values():
            yield from _references(sub)
    elif isinstance(value, list):
        for sub in value:
            yield from _references(sub)


def openapi_document(routes: Iterable[BaseRoute], version: str = "1") -> dict[str, Any]:
    """The document of ``routes`` (the app's); a route with no entry in ``OPERATIONS``, an
    entry with no route, a reference to no schema or a schema unused is an error, not a gap."""
    shapes = _Shapes()
    operations = OPERATIONS | BATCH_OPERATIONS
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if not isinstance(route, Route) or route.path.startswith(UNDOCUMENTED_PREFIX):
            continue
        for method in sorted((route.methods or set()) - {"HEAD"}):
            key = f"{method} {route.path_format}"
            if key not in operations:
                raise LookupError(f"{key} is served but has no entry in openapi/operations.py")
            operation = _operation(route, operations[key], shapes)
            paths.setdefault(route.path_format, {})[method.lower()] = operation
    served = {f"{method.upper()} {path}" for path, item in paths.items() for method in item}
    if set(operations) - served:
        raise LookupError(f"documented but not served: {sorted(set(operations) - served)}")
    written = shapes.within(UNMODELLED | BATCH_SCHEMAS)
    generated = model_components(shapes.models)
    if generated.keys() & written.keys():
        raise ValueError(f"schemas both generated and written: {generated.keys() & written}")
    schemas = generated | written
    names = {reference.removeprefix(COMPONENTS) for reference in _references([paths, schemas])}
    if names ^ schemas.keys():
        raise LookupError(f"references to no schema, or schemas unused: {names ^ schemas.keys()}")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchyard",
            "version": version,
            "description": "LLM gateway: /v1 for applications (API key: OpenAI's and "
            "Anthropic's APIs), /admin for operators (admin key or admin token). Errors use "
            "OpenAI's envelope, and Anthropic's on /v1/messages.",
        },
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": SECURITY_SCHEMES},
    }


class OpenApiDocument:
    """The document of one app's routes, as JSON: generated on its first request (schema
    generation takes a few hundred milliseconds, so it runs off the event loop), then kept."""

    def __init__(self, routes: Iterable[BaseRoute]) -> None:
        self._routes = list(routes)
        self._body: bytes | None = None

    async def body(self) -> bytes:
        if self._body is None:
            self._body = await asyncio.to_thread(
                lambda: orjson.dumps(openapi_document(self._routes))
            )
        return self._body


async def openapi_json(request: Request, services: Services) -> Response:
    """``GET /openapi.json``: the app's document, which its lifespan state holds."""
    document: OpenApiDocument = request.state.openapi
    return Response(await document.body(), media_type=JSON)


routes = [Route("/openapi.json", endpoint(openapi_json, Guard.NONE), methods=["GET"])]
