"""Event generators and the reference arithmetic the ledger's reports are checked against."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from ports import free_port

from gateway.ledger import UsageEvent

MODELS = ("gpt-4.1-mini", "qwen3:0.6b", "llama|3.1-8b")
PROVIDERS = {"gpt-4.1-mini": "openai", "qwen3:0.6b": "local", "llama|3.1-8b": "vllm-east"}
TEAMS = ("search", "support", "=risk")
TASKS = ("chat", "summarize", "")
# Attribution by index (not drawn, so the other fields stay what each seed always gave):
# untagged, one tag, two tags (counted in both), and end users with one left empty.
# A batch's line carries its batch's tag (docs/batches.md).
TAG_SETS: tuple[tuple[str, ...], ...] = (
    (),
    ("proj-x",),
    ("proj-x", "exp:1"),
    ("=risk",),
    ("proj-x", "batch:batch_1"),
    ("batch:msgbatch_2",),
)
END_USERS = ("ana", "bob", "", "user@example.com", "ana")
# The counters the reference arithmetic sums: those a report row is checked on (``pick``).
SUMS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_nanos", "errors")


def make_events(count: int, *, seed: int, keys: int = 5, days: int = 3) -> list[UsageEvent]:
    """Events spread over ``keys`` keys and the last ``days`` UTC days, with odd names."""
    rng = random.Random(seed)
    now = time.time()
    events = []
    for index in range(count):
        model = rng.choice(MODELS)
        prompt = rng.randint(0, 5000)
        events.append(
            UsageEvent(
                event_id=f"req-{seed}-{index}",
                time_ms=int((now - rng.randint(0, days - 1) * 86_400 - rng.random() * 60) * 1000),
                key_id=f"key{rng.randrange(keys)}",
                team=rng.choice(TEAMS),
                task=rng.choice(TASKS),
                model=model,
                provider=PROVIDERS[model],
                route="primary",
                prompt_tokens=prompt,
                completion_tokens=rng.randint(0, 2000),
                cached_tokens=rng.randint(0, prompt),
                cost_nanos=rng.randint(0, 90_000_000),
                policy_version="v1",
                latency_ms=rng.randint(5, 3000),
                ttft_ms=rng.randint(1, 500),
                status=rng.choice((200, 200, 200, 429, 502)),
                streamed=rng.random() < 0.5,
                usage_source=rng.choice(("provider", "estimated")),
                attempts=rng.randint(1, 3),
                end_user=END_USERS[index % len(END_USERS)],
                tags=TAG_SETS[index % len(TAG_SETS)],
            )
        )
    return events


def dimensions(event: UsageEvent, by: str) -> tuple[str, ...]:
    """The groups an event counts in: one, except by tag (each of its tags, or "")."""
    if by == "key":
        return (event.key_id,)
    if by == "day":
        return (event.day.isoformat(),)
    if by == "tag":
        return event.tags or ("",)
    if by == "batch":  # the batch tags' rows, by batch id
        return tuple(tag.removeprefix("batch:") for tag in event.tags if tag.startswith("batch:"))
    if by == "user":
        return (event.end_user,)
    return (str(getattr(event, by)),)


def expected_groups(events: list[UsageEvent], by: str) -> dict[str, dict[str, Any]]:
    """Sums per group, counting each request id once (first event wins, like the ledger)."""
    seen: set[tuple[str, str]] = set()
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: dict.fromkeys(SUMS, 0))
    for event in events:
        if (event.key_id, event.event_id) in seen:
            continue
        seen.add((event.key_id, event.event_id))
        for group in dimensions(event, by):
            row = groups[group]
            row["requests"] += 1
            row["prompt_tokens"] += event.prompt_tokens
            row["completion_tokens"] += event.completion_tokens
            row["cached_tokens"] += event.cached_tokens
            row["cost_nanos"] += event.cost_nanos
            row["errors"] += 1 if event.status >= 400 else 0
    return dict(groups)


def pick(row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in SUMS}


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on 127.0.0.1 in this event loop; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
