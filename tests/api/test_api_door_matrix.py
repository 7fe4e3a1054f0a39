"""Every front door reaches every provider kind, and the usage report equals the upstreams' books.

One gateway (uvicorn on a thread) in front of the native loopback upstreams (OpenAI with the
Responses API, the same upstream as a chat-only provider, Azure OpenAI, Anthropic, an engine
fleet of one vLLM-like replica) and the in-process engine on a tiny random checkpoint. The official SDKs are the clients: the openai
SDK for /v1/chat/completions and /v1/responses, the anthropic SDK for /v1/messages, each once
answered whole and once streamed. Then the key's usage report (``GET /v1/usage``) and its
usage events must equal what the upstreams themselves reported, to the token, cache reads and
writes included, and the cost must be those tokens at the policy's prices, to the nano-dollar.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from native_gateway import KEY_ENV, cost_nanos, merged, native_fleet, native_policy
from native_upstreams import NativeFleet

# model -> its answer; tiny is the local engine on random weights: any text.
SERVED = {
    "gpt": "openai says: hello",
    "gpt-chat": "openai says: hello",
    "azure-gpt": "azure says: hello",
    "claude": "anthropic says: hello",
    "fleet-llama": "engine says: hello",
    "tiny": None,
}
PROMPT = "hello"


@pytest.fixture(scope="module")
def matrix(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[tuple[RunningGateway, NativeFleet, str, str]]:
    from tiny_checkpoint import write_tiny_checkpoint

    root: Path = tmp_path_factory.mktemp("matrix")
    checkpoint = write_tiny_checkpoint(root / "tiny-qwen3", arch="qwen3")
    with pytest.MonkeyPatch.context() as env, native_fleet() as fleet:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        policy = root / "routing_rules.yaml"
        policy.write_text(native_policy(fleet, checkpoint))
        settings = make_settings(root / "data", policy, redis_url, upstream_read_timeout_s=60.0)
        with GatewayThread(settings, start_timeout_s=120) as gateway:
            key_id, key = gateway.create_key(name="matrix")
            yield gateway, fleet, key_id, key


def _chat(gateway: RunningGateway, key: str, model: str, stream: bool) -> tuple[str, Any]:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=60)
    args: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
    }
    if not stream:
        reply = client.chat.completions.create(**args)
        return reply.choices[0].message.content or "", reply.usage
    chunks = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    return text, chunks[-1].usage


def _messages(gateway: RunningGateway, key: str, model: str, stream: bool) -> tuple[str, Any]:
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0)
    args: dict[str, Any] = {
        "model": model,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    if not stream:
        message = client.messages.create(**args)
        return "".join(b.text for b in message.content if b.type == "text"), message.usage
    with client.messages.stream(**args) as events:
        final = events.get_final_message()
        return events.get_final_text(), final.usage


def _responses(gateway: RunningGateway, key: str, model: str, stream: bool) -> tuple[str, Any]:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0, timeout=60)
    if not stream:
        reply = client.responses.create(model=model, input=PROMPT, max_output_tokens=16)
        return reply.output_text, reply.usage
    events = list(
        client.responses.create(model=model, input=PROMPT, max_output_tokens=16, stream=True)
    )
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events[-1].response.output_text, events[-1].response.usage


DOORS = {"chat": _chat, "messages": _messages, "responses": _responses}


@pytest.mark.parametrize("door", list(DOORS))
def test_every_door_reaches_every_provider_kind(
    matrix: tuple[RunningGateway, NativeFleet, str, str], door: str
) -> None:
    gateway, fleet, _, key = matrix
    for model, expected in SERVED.items():
        for stream in (False, True):
            text, usage = DOORS[door](gateway, key, model, stream)
            if expected is not None:
                assert text == expected, (door, model, stream)
            prompt, completion = _tokens(usage)
            assert prompt > 0 and completion > 0, (door, model, stream)
    # The right native path at each upstream: the Responses API only where it is native.
    paths = {(seen.path, seen.body.get("model")) for seen in fleet["openai"].seen}
    assert ("/v1/responses", "gpt-4o") in paths or door != "responses"
    assert ("/v1/responses", "gpt-4o-mini") not in paths  # chat-only: translated
    assert all(
        seen.path == "/openai/deployments/prod-gpt4o/chat/completions"
        and seen.query == {"api-version": "2024-10-21"}
        for seen in fleet["azure"].seen
    )
    assert {seen.path for seen in fleet["anthropic"].seen} == {"/v1/messages"}
    # The fleet's replica gets Chat Completions (its only format), the request id with it.
    engine = fleet["engine"].seen
    assert {seen.path for seen in engine} == {"/v1/chat/completions"}
    assert all(seen.headers.get("x-request-id") for seen in engine)


def test_a_fleet_names_its_replica_whatever_the_door(
    matrix: tuple[RunningGateway, NativeFleet, str, str],
) -> None:
    gateway, fleet, _, key = matrix
    replica = fleet["engine"].replica.removeprefix("http://")
    auth = {"Authorization": f"Bearer {key}"}
    bodies = {
        "/chat/completions": {"messages": [{"role": "user", "content": PROMPT}]},
        "/messages": {"max_tokens": 8, "messages": [{"role": "user", "content": PROMPT}]},
        "/responses": {"input": PROMPT},
    }
    for path, body in bodies.items():
        for stream in (False, True):
            reply = httpx.post(
                gateway.v1 + path,
                json={**body, "model": "fleet-llama", "stream": stream},
                headers=auth,
                timeout=30,
            )
            assert reply.status_code == 200, reply.text
            route = reply.headers["x-switchyard-route"]
            assert f"replica={replica}" in route, (path, stream, route)


def _tokens(usage: Any) -> tuple[int, int]:
    """(all prompt tokens, completion tokens) of a usage object of any of the three formats."""
    if hasattr(usage, "prompt_tokens"):
        return usage.prompt_tokens, usage.completion_tokens
    if hasattr(usage, "cache_read_input_tokens"):  # Anthropic: input_tokens leaves caches out
        cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
        return usage.input_tokens + cached, usage.output_tokens
    return usage.input_tokens, usage.output_tokens


def test_the_usage_report_equals_the_upstreams_books(
    matrix: tuple[RunningGateway, NativeFleet, str, str],
) -> None:
    gateway, fleet, _, _ = matrix
    fleet.reset()
    key_id, key = gateway.create_key(name="books")
    local = [0, 0, 0]  # requests, prompt, completion: what the engine reported to clients
    for call in DOORS.values():
        for model in SERVED:
            for stream in (False, True):
                _, usage = call(gateway, key, model, stream)
                if model == "tiny":
                    prompt, completion = _tokens(usage)
                    local = [local[0] + 1, local[1] + prompt, local[2] + completion]
    # Cache-marked Anthropic turns: the upstream reports cache writes and reads.
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0)
    system = [{"type": "text", "text": "long context", "cache_control": {"type": "ephemeral"}}]
    message = {"role": "user", "content": PROMPT}
    for _ in range(2):
        reply = client.messages.create(
            model="claude", max_tokens=8, system=system, messages=[message]
        )
        assert reply.usage.cache_creation_input_tokens == 30
        assert reply.usage.cache_read_input_tokens == 40
    with client.messages.stream(
        model="claude", max_tokens=8, system=system, messages=[message]
    ) as events:
        assert events.get_final_message().usage.cache_read_input_tokens == 40
    gateway.wait_exported()
    usage = httpx.get(
        gateway.v1 + "/usage", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()
    rows = {row["model"]: row for row in usage["by_model"]}
    books = {
        "gpt": fleet["openai"].books().get("gpt-4o", {}),
        "gpt-chat": fleet["openai"].books().get("gpt-4o-mini", {}),
        "azure-gpt": fleet["azure"].books()["prod-gpt4o"],
        "claude": fleet["anthropic"].books()["claude-sonnet-4"],
        "fleet-llama": fleet["engine"].books()["llama-3-8b"],
    }
    books["tiny"] = dict(
        zip(("requests", "prompt_tokens", "completion_tokens"), local, strict=True)
    )
    books["tiny"]["cached_tokens"] = 0
    for model, book in books.items():
        row = rows[model]
        assert row["requests"] == book["requests"], model
        for field in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            assert row[field] == book[field], (model, field)
        assert row["cost_nanos"] == cost_nanos(model, book), model
    claude = books["claude"]
    assert claude["cache_write_tokens"] > 0 and claude["cached_tokens"] > 0
    # Cache writes are on every usage event (the aggregate report has no column for them yet).
    events = _events(gateway, key_id)
    written = sum(e["cache_write_tokens"] for e in events if e["model"] == "claude")
    assert written == claude["cache_write_tokens"]
    assert len(events) == sum(book["requests"] for book in books.values())
    assert all(e["usage_source"] == "provider" and e["status"] == 200 for e in events)
    everything = merged(*books.values())
    assert usage["prompt_tokens"] == everything["prompt_tokens"]
    assert usage["completion_tokens"] == everything["completion_tokens"]
    assert usage["total_cost_nanos"] == sum(cost_nanos(m, b) for m, b in books.items())


def _events(gateway: RunningGateway, key_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    cursor = ""
    gateway.wait_exported()
    with gateway.admin() as admin:
        while True:
            page = admin.get(
                "/admin/usage/events", params={"key": key_id, "limit": 200, "cursor": cursor}
            ).json()
            events.extend(page["data"])
            cursor = page.get("next_cursor") or ""
            if not cursor:
                return events
