"""Unknown ``x-switchyard-*`` request headers are a 400 naming them, in the door's envelope,
on /v1 and /admin, and in a route explanation's headers; the ones the gateway reads pass.
Official SDKs as clients, the native loopback upstreams behind the gateway."""

from __future__ import annotations

import re
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from gateway.api.request_headers import REQUEST_HEADERS, SENT_HEADERS, unknown_request_headers

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "Hi"}]


def test_every_x_switchyard_header_in_the_code_is_listed() -> None:
    """A header the gateway starts reading must join REQUEST_HEADERS (or it is refused)."""
    named = set()
    for source in (ROOT / "gateway").rglob("*.py"):
        if source.name == "request_headers.py":  # its docstring names typos on purpose
            continue
        named |= set(re.findall(r"x-switchyard-[a-z0-9-]*[a-z0-9]", source.read_text().lower()))
    assert named <= REQUEST_HEADERS | SENT_HEADERS, named - (REQUEST_HEADERS | SENT_HEADERS)
    assert {"x-switchyard-cache", "x-switchyard-tags", "x-switchyard-user"} == REQUEST_HEADERS


def test_a_requests_unknown_headers_are_read_from_its_header_map() -> None:
    """Any case, a name sent twice named once, sorted; the headers the gateway reads pass."""
    scope = {
        "headers": [
            (b"X-Switchyard-Task", b"chat"),
            (b"x-switchyard-tags", b"a"),
            (b"X-SWITCHYARD-TASK", b"again"),
            (b"x-switchyard-route", b"mine"),
            (b"authorization", b"Bearer k"),
        ]
    }
    assert unknown_request_headers(scope) == ["x-switchyard-route", "x-switchyard-task"]
    assert unknown_request_headers({"headers": [(b"X-Switchyard-User", b"u")]}) == []
    assert unknown_request_headers({"headers": []}) == []


def test_openai_door_refuses_a_typo_naming_it(native) -> None:
    client = openai.OpenAI(base_url=native.gateway.v1, api_key=native.key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="gpt", messages=HI, extra_headers={"X-Switchyard-Task": "chat"}
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == "x-switchyard-task" and error["code"] == "unknown_header"
    assert "x-switchyard-task" in error["message"] and "X-Task-Type" in error["message"]


def test_anthropic_door_refuses_in_anthropics_envelope(native) -> None:
    client = anthropic.Anthropic(
        base_url=native.gateway.base_url, api_key=native.key, max_retries=0
    )
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="claude",
            max_tokens=16,
            messages=HI,
            extra_headers={"x-switchyard-tag": "a", "x-switchyard-usr": "b"},
        )
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "x-switchyard-tag, x-switchyard-usr" in body["error"]["message"]


def test_the_headers_the_gateway_reads_pass(native) -> None:
    client = openai.OpenAI(base_url=native.gateway.v1, api_key=native.key, max_retries=0)
    reply = client.chat.completions.with_raw_response.create(
        model="gpt",
        messages=HI,
        extra_headers={
            "x-switchyard-user": "alice",
            "x-switchyard-tags": "a,b",
            "x-switchyard-cache": "bypass",
        },
    )
    assert reply.status_code == 200


def test_admin_routes_refuse_them_too(native) -> None:
    with native.gateway.admin() as admin:
        listed = admin.get("/admin/keys", headers={"x-switchyard-team": "search"})
        assert listed.status_code == 400
        assert listed.json()["error"]["param"] == "x-switchyard-team"
        body = {"messages": HI}
        typo = admin.post(
            "/admin/route/explain", json={"body": body, "headers": {"x-switchyard-task": "code"}}
        )
        assert typo.status_code == 400
        assert typo.json()["error"]["param"] == "headers.x-switchyard-task"
        explained = admin.post(
            "/admin/route/explain",
            json={"body": {**body, "model": "gpt"}, "headers": {"x-switchyard-user": "alice"}},
        )
        assert explained.status_code == 200, explained.text


def test_probes_are_not_guarded(native) -> None:
    assert httpx.get(
        native.gateway.base_url + "/healthz", headers={"x-switchyard-x": "1"}
    ).is_success
