"""Typed checks of /v1 bodies over HTTP: every field the gateway reads is checked and named in a
400, everything else reaches the upstream as sent, nothing the client sends gives a 500, and a
client value is never echoed whole."""

from __future__ import annotations

import json
import time

import httpx
import openai
import orjson
import pytest
from fake_upstream import FakeUpstream
from gateway_runner import RunningGateway

HI = [{"role": "user", "content": "hi"}]


def _post(gateway: RunningGateway, key: str, body: object, path: str = "/chat/completions"):
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(
        gateway.v1 + path,
        content=content,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=10,
    )


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def access_lines(gateway: RunningGateway, request_id: str, wait_s: float = 3.0) -> list[dict]:
    """The access log lines of one request (written once its answer has gone out)."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = [
            json.loads(line)
            for line in gateway.log.getvalue().splitlines()
            if line.startswith("{") and f'"request_id":"{request_id}"' in line
        ]
        found = [line for line in lines if line.get("event") == "request"]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_the_reported_type_error_is_a_400_and_logged_as_one(
    gateway: RunningGateway, key: str
) -> None:
    response = httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": {}, "content": None}]},
        headers={"Authorization": f"Bearer {key}", "X-Request-ID": "typed-role-1"},
    )
    assert response.status_code == 400
    error = _error(response)
    assert error["param"] == "messages[0].role" and error["type"] == "invalid_request_error"
    assert "messages[0].role" in error["message"]
    (line,) = access_lines(gateway, "typed-role-1")
    assert line["status"] == 400 and line["route"] == "chat.completions"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/chat/completions",
            {"messages": [{"role": ["user"], "content": "x"}]},
            "messages[0].role",
        ),
        (
            "/chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            "messages[0].role",
        ),
        ("/chat/completions", {"messages": [{"content": "x"}]}, "messages[0].role"),
        ("/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": 5}]},
            "messages[0].content",
        ),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]},
            "messages[0].content[0].text",
        ),
        (
            "/chat/completions",
            {"messages": [{"role": "user", "content": ["x"]}]},
            "messages[0].content[0]",
        ),
        (
            "/chat/completions",
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        ("/chat/completions", {"messages": "hi"}, "messages"),
        ("/chat/completions", {"messages": []}, "messages"),
        ("/chat/completions", {"messages": HI, "model": ""}, "model"),
        ("/chat/completions", {"messages": HI, "model": {"name": "x"}}, "model"),
        ("/chat/completions", {"messages": HI, "n": 0}, "n"),
        ("/chat/completions", {"messages": HI, "n": 129}, "n"),
        ("/chat/completions", {"messages": HI, "n": True}, "n"),
        ("/chat/completions", {"messages": HI, "best_of": "2"}, "best_of"),
        ("/chat/completions", {"messages": HI, "max_tokens": 1.5}, "max_tokens"),
        (
            "/chat/completions",
            {"messages": HI, "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
        ("/chat/completions", {"messages": HI, "stream": "yes"}, "stream"),
        (
            "/chat/completions",
            {"messages": HI, "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        (
            "/chat/completions",
            {"messages": HI, "stream": True, "stream_options": {"include_usage": "y"}},
            "stream_options.include_usage",
        ),
        ("/chat/completions", {"messages": HI, "tools": {"type": "function"}}, "tools"),
        (
            "/chat/completions",
            {"messages": HI, "tools": [{"function": {"name": "f"}}]},
            "tools[0].type",
        ),
        (
            "/chat/completions",
            {
                "messages": HI,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}],
            },
            "tools[0].function.parameters",
        ),
        (
            "/chat/completions",
            {"messages": HI, "functions": [{"description": "x"}]},
            "functions[0].name",
        ),
        ("/chat/completions", {"messages": HI, "response_format": "json"}, "response_format"),
        (
            "/chat/completions",
            {
                "messages": HI,
                "response_format": {"type": "json_schema", "json_schema": {"schema": {}}},
            },
            "response_format.json_schema.name",
        ),
        ("/chat/completions", {"messages": HI, "metadata": ["task"]}, "metadata"),
        ("/chat/completions", {"messages": HI, "metadata": {"task_type": 3}}, "metadata.task_type"),
        ("/chat/completions", {"messages": HI, "user": 42}, "user"),
        ("/chat/completions", {"messages": HI, "stop": [1]}, "stop[0]"),
        ("/chat/completions", {"messages": HI, "temperature": "hot"}, "temperature"),
        ("/completions", {"model": "fake", "prompt": []}, "prompt"),
        ("/completions", {"model": "fake", "prompt": [{"text": "x"}]}, "prompt[0]"),
        ("/completions", {"model": "fake"}, "prompt"),
        ("/embeddings", {"model": "embed-model", "input": ""}, "input"),
        ("/embeddings", {"model": "embed-model", "input": [[1, "a"]]}, "input[0][1]"),
        ("/embeddings", {"input": "x"}, "model"),
        ("/embeddings", {"model": "embed-model", "input": "x", "stream": True}, "stream"),
        ("/images/generations", {"model": "image-model", "prompt": "p", "n": 11}, "n"),
        ("/images/generations", {"model": "image-model", "prompt": None}, "prompt"),
    ],
)
def test_every_field_read_is_typed_and_named(
    gateway: RunningGateway, key: str, path: str, body: dict, param: str
) -> None:
    response = _post(gateway, key, body, path)
    assert response.status_code == 400, response.text
    error = _error(response)
    assert error["param"] == param
    assert error["message"].startswith(param + ": ")


def test_sdk_sees_the_field_path(gateway: RunningGateway, key: str) -> None:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="fake",
            messages=HI,
            tools=[{"type": "function", "function": {"name": ""}}],  # type: ignore[list-item]
        )
    assert caught.value.param == "tools[0].function.name"  # type: ignore[attr-defined]


def test_unknown_and_unread_fields_reach_the_upstream_untouched(
    gateway: RunningGateway, key: str, fake_upstream: FakeUpstream
) -> None:
    body = {
        "model": "other",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"x": 1}}],
            },
            {"role": "assistant", "content": None, "refusal": None, "audio": {"id": "a1"}},
            {"role": "tool", "tool_call_id": "call_9", "content": "42"},
        ],
        "temperature": 1,  # an integer stays an integer
        "top_p": 0.1,
        "seed": 12345678901234567,
        "logit_bias": {"50256": -100},
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "response_format": {"type": "json_object"},
        "metadata": {"team": "search", "trace": "t-1"},
        "a_field_openai_adds_next_year": {"nested": [1, 2.5, None, {"deep": True}]},
    }
    response = _post(gateway, key, body)
    assert response.status_code == 200, response.text
    seen = fake_upstream.requests[-1].body
    assert seen == {**body, "model": "fake-other"}
    assert isinstance(seen["temperature"], int)


def test_deep_nesting_is_a_400_not_a_500(gateway: RunningGateway, key: str) -> None:
    # orjson parses 1024 levels but writes only 254: such a body once failed when forwarded.
    for depth in (65, 300, 1100, 30_000):
        nested = b"[" * depth + b"]" * depth
        body = (
            b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "x": '
            + nested
            + b"}"
        )
        response = _post(gateway, key, body)
        assert response.status_code == 400, (depth, response.text)
        assert _error(response)["code"] == "nesting_too_deep"
    ok = {"model": "fake", "messages": HI, "x": json.loads("[" * 62 + "]" * 62)}
    assert _post(gateway, key, ok).status_code == 200


def test_client_values_are_not_echoed_whole(gateway: RunningGateway, key: str) -> None:
    long_model = "m" * 60_000
    response = _post(gateway, key, {"model": long_model, "messages": HI})
    assert response.status_code == 404
    assert len(response.content) < 2_000
    assert "60000 characters" in _error(response)["message"]
    path = "/v1/" + "p" * 6000
    missing = httpx.get(gateway.base_url + path)
    assert missing.status_code == 404 and len(missing.content) < 2_000
    with gateway.admin() as admin:
        key_response = admin.get("/admin/keys/" + "k" * 5000)
        assert key_response.status_code == 404 and len(key_response.content) < 2_000
        report = admin.get("/admin/usage", params={"from": "d" * 30})
        assert report.status_code == 400 and len(report.content) < 2_000
