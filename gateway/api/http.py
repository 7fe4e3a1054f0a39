"""Small HTTP helpers shared by the API modules: body reading, JSON and error responses."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api.strict_json import parse_json_object
from gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge
from gateway.server.header_map import header_map

JSON = "application/json"


def client_address(request: Request) -> str:
    """The peer's address (behind a proxy: what uvicorn's proxy-headers handling made it)."""
    return request.client.host if request.client else "unknown"


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = header_map(request.scope).get("content-length")
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
