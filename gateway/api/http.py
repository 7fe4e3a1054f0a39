"""Small HTTP helpers shared by the API modules: body reading, JSON and error responses."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.strict_json import parse_json_object
from gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge

JSON = "application/json"
REQUEST_ID_HEADER = "x-request-id"
_MAX_REQUEST_ID = 200
_REQUEST_ID_KEY = "switchyard.request_id"


def request_id_of(request: Request) -> str:
    """The client's X-Request-ID when it is sane, else a fresh one; the same for the whole
    request (kept in its scope), so its log lines and answer agree."""
    known = request.scope.get(_REQUEST_ID_KEY)
    if known is not None:
        return known
    incoming = request.headers.get(REQUEST_ID_HEADER)
    if incoming and len(incoming) <= _MAX_REQUEST_ID and incoming.isprintable():
        request_id = incoming
    else:
        request_id = uuid.uuid4().hex
    request.scope[_REQUEST_ID_KEY] = request_id
    return request_id


def client_address(request: Request) -> str:
    """The peer's address (behind a proxy: what uvicorn's proxy-headers handling made it)."""
    return request.client.host if request.client else "unknown"


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("Content-Length must be a number", param="content-length")
        if int(declared) > max_bytes:
            raise PayloadTooLarge(f"request body is larger than the limit of {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:  # chunked uploads carry no Content-Length
            raise PayloadTooLarge(f"request body is larger than the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    return parse_json_object(await read_body(request, max_bytes))


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, headers=headers, media_type=JSON)


def error_response(exc: GatewayError, headers: dict[str, str] | None = None) -> Response:
    merged = {**(headers or {}), **exc.headers}
    return Response(exc.body_bytes(), status_code=exc.status, headers=merged, media_type=JSON)
