"""What pieces of a /v1 request's own work cost, each beside the way it was done before.

``python -m bench.request_pieces [--repeat N]``: CPU time per call, best of seven rounds, in
this process:

- the header lookups a JSON request makes (its credential, request id, attribution, cache
  directive, task header, forwarded headers), on the headers the OpenAI SDK sends: through
  Starlette's ``Headers`` (before) and through ``header_map``'s dict (now);
- the access line: through structlog's lazy proxy, which ``build_logger`` used to return and
  which assembles a bound logger on every call (before), and through the bound logger (now);
- ``Calls.deliver`` of a whole answer, with the request's end itself left out: drained through
  the stream's generators (before) and ended directly (now);
- reading a JSON body strictly (``parse_json_object``), on the bench's chat body and on a
  40-message chat of 12.7 KB whose text has colons: with the stdlib's duplicate-key parse
  every time (before) and with the colon count first (now);
- the guard against unknown ``x-switchyard-*`` headers (``HeaderGuardMiddleware``), with the
  request's header map the route builds anyway: each name decoded into a set of its own
  (before) and one pass over the header map's names (now);
- the exporter's decode of a usage event this process recorded: its JSON decoded and checked
  (before), and the event kept at the append taken back by its JSON and checked (now);
- the prompt's token bound that the limiter reserves (``_bytes_bound`` over the messages), on
  the bench's body and the 12.7 KB chat: summed over generators (before) and in loops (now);
- a model's price as a request reads it (costed twice, its catalogue recorded once), for a
  model with a ``price:``: through the private attribute, which pydantic serves by
  ``__getattr__`` after a failed lookup (before), and cached on the model (now);
- what a /v1 handler takes from the lifespan (the services and the v1 pipeline), on a new
  ``Request``: through ``request.state`` (before) and from the scope's state (now);
- a hot-path Redis round trip (``DirectRedis``) of 1, 2 and 10 replies (a reservation; a lone
  request's settle and usage record; a settle batch of nine), on an embedded Redis of its own:
  each reply read by redis-py's ``read_response`` (before) and all of them by the
  connection's hiredis reader under one deadline (now). This process's CPU only;
- a reply that is on the socket when the read starts (as it mostly is with Redis on this
  process's core: run under ``taskset -c 0``): waited for through the event loop (before) and
  taken from the socket at once by ``ReadyReplies`` (now); the count of tries that found it is
  printed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import structlog
from starlette.requests import Request
from starlette.responses import Response

from bench.gateway import BODY as BENCH_BODY
from bench.machine import cpu_model, cpu_us_per_call
from gateway.access.auth import client_credential
from gateway.api.endpoint import services_of
from gateway.api.request_headers import unknown_headers, unknown_request_headers
from gateway.api.strict_json import _reject_duplicates, check_depth, parse_json_object
from gateway.api.v1.request_end import Calls, Reply
from gateway.cache.controls import directive_of
from gateway.ledger import UsageEvent
from gateway.logs import LazyFlushStream, _processors, build_logger
from gateway.metering.attribution import take_attribution
from gateway.metering.dead_letters import decode_entry
from gateway.metering.recent_events import RecentEvents
from gateway.policy.models import ModelConfig, Price
from gateway.providers.forwarding import forwarded_headers
from gateway.routing.estimate import _IMAGE_PARTS, IMAGE_PART_TOKENS, _bytes_bound
from gateway.routing.router import _header
from gateway.server.header_map import header_map
from gateway.store.connect import connect_redis
from gateway.store.direct import DirectRedis, _read_through_redis_py, pack, read_replies, send
from gateway.store.embedded import EmbeddedRedis
from gateway.store.ready_replies import ReadyReplies

# What the OpenAI Python SDK sends with a chat request.
SDK_HEADERS = [
    (b"host", b"127.0.0.1:8080"),
    (b"accept-encoding", b"gzip, deflate"),
    (b"connection", b"keep-alive"),
    (b"accept", b"application/json"),
    (b"content-type", b"application/json"),
    (b"user-agent", b"OpenAI/Python 1.99.0"),
    (b"x-stainless-lang", b"python"),
    (b"x-stainless-package-version", b"1.99.0"),
    (b"x-stainless-os", b"Linux"),
    (b"x-stainless-arch", b"x64"),
    (b"x-stainless-runtime", b"CPython"),
    (b"x-stainless-retry-count", b"0"),
    (b"authorization", b"Bearer sk-bench-0123456789"),
    (b"content-length", b"120"),
]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ACCESS_FIELDS: dict[str, Any] = {
    "request_id": "0f" * 16,
    "usage_id": "01938a" * 5,
    "route": "/v1/chat/completions",
    "key_id": "k_1234567890",
    "model": "gpt-4o-mini",
    "provider": "openai",
    "status": 200,
    "stream": False,
    "task": "chat",
    "strategy": "cheapest",
    "route_reason": "rule: default",
    "attempts": 1,
    "latency_ms": 1.234,
    "prompt_tokens": 12,
    "completion_tokens": 20,
    "error": None,
}


CHAT = orjson.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [
            {
                "role": "user" if turn % 2 else "assistant",
                "content": "Here is a paragraph of plain English text about the weather: it rains. "
                * 4,
            }
            for turn in range(40)
        ],
        "max_tokens": 256,
        "temperature": 0.2,
    }
)


def strict_before(raw: bytes) -> dict[str, Any]:
    """``parse_json_object`` as it was: the stdlib's parse for duplicates on every body."""
    data = orjson.loads(raw)
    check_depth(raw, data)
    _reject_duplicates(raw.decode())
    return data


def lookups(headers: Mapping[str, str]) -> None:
    """The lookups of one JSON request, in the order the pipeline makes them."""
    headers.get("content-length")
    client_credential(headers)
    headers.get("x-request-id")
    take_attribution(BODY, headers, None)
    directive_of(headers)
    _header(headers, "x-task-type")
    forwarded_headers(headers, (), "0f" * 16)


def through_headers() -> None:
    lookups(Request({"type": "http", "headers": SDK_HEADERS}).headers)


def through_header_map() -> None:
    lookups(header_map(Request({"type": "http", "headers": SDK_HEADERS}).scope))


def bytes_bound_before(value: Any) -> int:
    """``_bytes_bound`` as it was, each list and dict summed over a generator."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, list):
        return sum(bytes_bound_before(item) for item in value)
    if isinstance(value, dict):
        if value.get("type") in _IMAGE_PARTS:
            return IMAGE_PART_TOKENS
        return sum(
            bytes_bound_before(key) + bytes_bound_before(item) for key, item in value.items()
        )
    if value is None or isinstance(value, bool):
        return 5
    return len(str(value))


def guard_before() -> None:
    scope = {"headers": SDK_HEADERS}
    unknown_headers(name.decode("latin-1") for name, _ in scope["headers"])
    header_map(scope)  # built by the route in any case


def guard_now() -> None:
    unknown_request_headers({"headers": SDK_HEADERS})


# A usage event as a bench request leaves it.
EVENT = UsageEvent(
    event_id="0193a4b2-7c1d-7e2f-8a3b-4c5d6e7f8091",
    time_ms=1_796_400_000_000,
    key_id="k_1234567890",
    model="gpt-4o-mini",
    provider="openai",
    task="chat",
    route="default",
    prompt_tokens=12,
    completion_tokens=20,
    cost_nanos=12_345,
    latency_ms=4,
    policy_version="3",
)


def export_decode_now(recent: RecentEvents, payload: bytes) -> None:
    recent.remember(payload, EVENT)  # at the append, on the request's path
    decode_entry(payload, known=recent.take(payload))


def access_loggers() -> tuple[Any, Any]:
    """The lazy proxy ``build_logger`` used to return, and what it returns now, both writing
    JSON lines to /dev/null as the app's sink does."""
    sink = LazyFlushStream(open("/dev/null", "wb"))  # noqa: SIM115 - kept for the process
    proxy = structlog.wrap_logger(
        structlog.BytesLogger(sink),
        processors=_processors("json"),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )
    return proxy, build_logger("info", "json", sink)


class _Endless(Calls):
    """``Calls`` whose request end records nothing: what is timed is the way to it."""

    def __init__(self) -> None:
        pass

    def _end(self, call: Any, reply: Reply) -> None:
        return None


async def _through_generators(calls: Calls, reply: Reply) -> Response:
    content = b"".join([piece async for piece in calls._ended(None, reply)])  # type: ignore[arg-type]
    return Response(content, status_code=reply.status, headers=reply.headers)


async def per_await_us(make: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(7):
        started = time.process_time()
        for _ in range(n):
            await make()
        best = min(best, (time.process_time() - started) / n)
    return best * 1e6


PRICED = ModelConfig(provider="bench", price=Price(input=0.15, output=0.6))


def price_reads_before(config: ModelConfig) -> None:
    for _ in range(2):
        config._catalogue if config._catalogue is not None else config.price  # noqa: B018
    config._catalogue.version if config._catalogue is not None else ""  # noqa: B018


def price_reads_now(config: ModelConfig) -> None:
    config.pricing  # noqa: B018
    config.pricing  # noqa: B018
    config.price_catalogue  # noqa: B018


STATE_SCOPE = {"type": "http", "headers": [], "state": {"services": object(), "v1": object()}}


def lifespan_state_before() -> None:
    request = Request(STATE_SCOPE)
    request.state.services  # noqa: B018
    request.state.v1  # noqa: B018


def lifespan_state_now() -> None:
    request = Request(STATE_SCOPE)
    services_of(request)
    request.scope["state"]["v1"]


async def _round_trips(repeat: int) -> tuple[list[tuple[str, float, float]], str]:
    with tempfile.TemporaryDirectory(prefix="pieces-redis-") as data_dir:
        server = EmbeddedRedis(data_dir, appendonly=False)
        direct = DirectRedis(connect_redis(server.start(), 5.0))
        try:
            await direct.call("PING")  # one connection, open, reused by every round trip
            connection = direct._idle[0]
            rows = []
            for count in (1, 2, 10):
                packed = pack([("ECHO", "x" * 40)] * count)

                async def before(packed: bytes = packed, count: int = count) -> None:
                    await send(connection, packed)
                    await _read_through_redis_py(connection, count)

                async def now(packed: bytes = packed, count: int = count) -> None:
                    await send(connection, packed)
                    await read_replies(connection, count)

                rows.append(
                    (
                        f"Redis round trip, {count} repl{'y' if count == 1 else 'ies'}",
                        await per_await_us(before, repeat),
                        await per_await_us(now, repeat),
                    )
                )
            packed, ready = pack([("ECHO", "x" * 40)]), ReadyReplies()

            async def waited() -> None:
                await send(connection, packed)
                await read_replies(connection, 1)

            async def taken() -> None:
                await send(connection, packed)
                await read_replies(connection, 1, ready)

            rows.append(
                (
                    "Redis reply already on the socket",
                    await per_await_us(waited, repeat),
                    await per_await_us(taken, repeat),
                )
            )
            tries = ready.hits + ready.misses
            return rows, f"replies taken from the socket at once: {ready.hits} of {tries} tries"
        finally:
            await direct.client.aclose()
            server.stop()


def measure(repeat: int) -> tuple[list[tuple[str, float, float]], str]:
    """(piece, before µs, now µs) for each piece, and a note on the reads taken at once."""
    proxy, bound = access_loggers()
    calls, reply = _Endless(), Reply(200, {"x-switchyard-cache": "miss"}, b'{"id":"x"}')
    deliver_before = asyncio.run(per_await_us(lambda: _through_generators(calls, reply), repeat))
    deliver_now = asyncio.run(per_await_us(lambda: calls.deliver(None, reply), repeat))  # type: ignore[arg-type]
    recent, payload = RecentEvents(), EVENT.to_json()
    round_trips, note = asyncio.run(_round_trips(max(repeat // 5, 1)))
    rows = [
        (
            "header lookups of a JSON request",
            cpu_us_per_call(through_headers, repeat),
            cpu_us_per_call(through_header_map, repeat),
        ),
        (
            "access line",
            cpu_us_per_call(lambda: proxy.info("request", **ACCESS_FIELDS), repeat),
            cpu_us_per_call(lambda: bound.info("request", **ACCESS_FIELDS), repeat),
        ),
        ("deliver a whole answer", deliver_before, deliver_now),
        (
            "unknown-header guard",
            cpu_us_per_call(guard_before, repeat),
            cpu_us_per_call(guard_now, repeat),
        ),
        (
            "export decode of an own event",
            cpu_us_per_call(lambda: decode_entry(payload), repeat),
            cpu_us_per_call(lambda: export_decode_now(recent, payload), repeat),
        ),
        *(
            (
                f"token bound, {name}",
                cpu_us_per_call(lambda messages=messages: bytes_bound_before(messages), repeat),
                cpu_us_per_call(lambda messages=messages: _bytes_bound(messages), repeat),
            )
            for name, messages in (
                ("bench body", BENCH_BODY["messages"]),
                ("12.7 KB chat", orjson.loads(CHAT)["messages"]),
            )
        ),
        *(
            (
                f"strict JSON, {name}",
                cpu_us_per_call(lambda raw=raw: strict_before(raw), repeat),
                cpu_us_per_call(lambda raw=raw: parse_json_object(raw), repeat),
            )
            for name, raw in (("bench body", orjson.dumps(BENCH_BODY)), ("12.7 KB chat", CHAT))
        ),
        (
            "model price, as a request reads it",
            cpu_us_per_call(lambda: price_reads_before(PRICED), repeat),
            cpu_us_per_call(lambda: price_reads_now(PRICED), repeat),
        ),
        (
            "lifespan state, as a handler reads",
            cpu_us_per_call(lifespan_state_before, repeat),
            cpu_us_per_call(lifespan_state_now, repeat),
        ),
        *round_trips,
    ]
    return rows, note


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20_000, help="calls per round")
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_model()}; CPU time per call, best of 7 rounds of {args.repeat}")
    print(f"{'piece':36} {'before µs':>10} {'now µs':>8}")
    rows, note = measure(args.repeat)
    for name, before, now in rows:
        print(f"{name:36} {before:10.2f} {now:8.2f}")
    print(f"({note})")


if __name__ == "__main__":
    main()
