"""A served request leaves no reference cycle behind: everything it built is freed by reference
counting as it ends, so the cyclic collector has nothing of it to walk.

A cycle per request (the exchange's end callback holding the request, whose scope holds the
exchange; tenacity's retry state built for every call) once made the collector run every few
requests and cost the gateway about a fifth of its CPU at 64 concurrent requests
(docs/benchmarks.md)."""

from __future__ import annotations

import gc
from collections import Counter

import httpx
from gateway_runner import RunningGateway

HI = [{"role": "user", "content": "hi"}]
REQUESTS = 30
# The server side of a request: its objects are of these packages' types. (The test's own
# client, httpx, leaves cycles of its own; builtins cannot be told apart, so they are not
# counted.)
SERVER_PACKAGES = (
    "gateway.",
    "starlette.",
    "uvicorn.",
    "tenacity",
    "aiohttp.",
    "multidict",
    "yarl",
    "redis.",
    "structlog.",
)


def test_served_requests_leave_no_cycles(
    gateway: RunningGateway, key: str, saved_garbage: list[object]
) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=gateway.v1, headers=headers, timeout=30) as client:

        def serve(count: int) -> None:
            for number in range(count):
                body = {"model": "fake", "messages": HI, "stream": number % 2 == 1}
                response = client.post("/chat/completions", json=body)
                assert response.status_code == 200, response.text

        serve(4)  # the connection pools filled (opening a Redis connection leaves a cycle)
        gc.collect()
        saved_garbage.clear()
        serve(REQUESTS)
    gc.collect()
    server_side = Counter(
        f"{type(o).__module__}.{type(o).__qualname__}"
        for o in saved_garbage
        if type(o).__module__.startswith(SERVER_PACKAGES)
    )
    errors = [repr(o)[:200] for o in saved_garbage if isinstance(o, BaseException)]
    assert not server_side, (sorted(server_side.items()), errors[:5])  # errors: what failed
