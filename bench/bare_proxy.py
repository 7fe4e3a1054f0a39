"""A bare proxy, for ``python -m bench.parts``: the floor a Python gateway stands on.

What any Starlette gateway must do for a chat request and nothing more: uvicorn (uvloop,
httptools, no access log, as ``switchyard serve`` runs it) hands the request to one Starlette
route, which reads the body and POSTs it with a pooled aiohttp session to the upstream at
``BENCH_BARE_UPSTREAM``, then answers with the upstream's status, body and content type; a
request whose JSON asks ``"stream": true`` gets the upstream's body relayed as it arrives,
each read passed on as it is (Starlette's ``StreamingResponse``). No key, limits, routing,
usage record, log line or metric; no Redis. It listens on ``SWITCHYARD_PORT`` and answers
``/healthz``. A bench-side server only.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def create_bare_app(upstream: str) -> Starlette:
    """The proxy of ``upstream`` (a base URL ending in ``/v1``)."""
    sessions: list[aiohttp.ClientSession] = []

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)))
        try:
            yield
        finally:
            await sessions[0].close()

    async def chat(request: Request) -> Response:
        body = await request.body()
        streamed = orjson.loads(body).get("stream") is True
        headers = {"content-type": "application/json", "authorization": "Bearer bare"}
        answer = await sessions[0].post(upstream + "/chat/completions", data=body, headers=headers)
        media_type = answer.headers.get("content-type", "application/json")
        if not streamed:
            async with answer:
                return Response(await answer.read(), answer.status, media_type=media_type)

        async def relayed() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.content.iter_any():
                    yield chunk
            finally:
                answer.release()

        return StreamingResponse(relayed(), answer.status, media_type=media_type)

    async def healthz(_request: Request) -> Response:
        return Response(b"ok", media_type="text/plain")

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/healthz", healthz),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    app = create_bare_app(os.environ["BENCH_BARE_UPSTREAM"])
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(os.environ["SWITCHYARD_PORT"]),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
