"""/admin input on a real gateway: policies nested too deeply or full of aliases, malformed
key fields and query strings, explain bodies. Each is a 400 naming the field, nothing is
half-applied, nothing is a 500; and the dashboard answers a stopped Redis with a 503 page."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dashboard_client import login
from gateway_runner import ADMIN_KEY, GatewayThread, RunningGateway, make_settings

ALIAS_BOMB = "\n".join(
    [
        'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
        *(
            f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]"
            for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
    ]
)


@pytest.fixture(scope="module")
def own_gateway(tmp_path_factory, fake_policy: Path, redis_url: str) -> Iterator[RunningGateway]:
    """A gateway on its own copy of the policy file, which these tests try to break."""
    directory = tmp_path_factory.mktemp("admin-input")
    copy = directory / "routing_rules.yaml"
    shutil.copy(fake_policy, copy)
    runner = GatewayThread(make_settings(directory / "data", copy, redis_url))
    running = runner.start()
    try:
        yield running
    finally:
        runner.stop()


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


POLICY_BOMBS = {
    "deep YAML flow": ("application/yaml", "[" * 5000 + "]" * 5000),
    "deep YAML block": (
        "application/yaml",
        "models:\n" + "".join("  " * depth + "k:\n" for depth in range(1, 400)),
    ),
    "deep JSON": ("application/json", "[" * 5000 + "]" * 5000),
    "JSON past the policy depth": ("application/json", '{"models": ' + "[" * 40 + "]" * 40 + "}"),
    "alias bomb": ("application/yaml", ALIAS_BOMB),
    "recursive alias": ("application/yaml", "models: &m {x: *m}"),
}


@pytest.mark.parametrize("content_type,text", POLICY_BOMBS.values(), ids=POLICY_BOMBS.keys())
def test_hostile_policies_are_refused_and_change_nothing(
    own_gateway: RunningGateway, content_type: str, text: str
) -> None:
    path = own_gateway.settings.policy_file
    before_text = path.read_text()
    before_version = own_gateway.services.policies.current.version
    with own_gateway.admin() as admin:
        for method, url in (("POST", "/admin/policy/validate"), ("PUT", "/admin/policy")):
            response = admin.request(
                method, url, content=text.encode(), headers={"content-type": content_type}
            )
            assert response.status_code == 400, (url, response.text)
            error = _error(response)
            assert error["code"] == "invalid_policy"
            assert "nested more than" in error["message"] or "alias" in error["message"]
    assert path.read_text() == before_text
    assert own_gateway.services.policies.current.version == before_version


def test_a_policy_with_ordinary_anchors_still_validates(own_gateway: RunningGateway) -> None:
    original = own_gateway.settings.policy_file.read_text()
    # One model's price block shared by another through an alias: the common use of anchors.
    anchored = original.replace(
        "price: {input: 1000, output: 2000}", "price: &shared {input: 1000, output: 2000}", 1
    ).replace("price: {input: 1, output: 1}", "price: *shared", 1)
    assert anchored.count("&shared") == 1 and anchored.count("*shared") == 1
    with own_gateway.admin() as admin:
        response = admin.post(
            "/admin/policy/validate",
            content=anchored.encode(),
            headers={"content-type": "application/yaml"},
        )
    assert response.status_code == 200, response.text
    assert response.json()["valid"] is True


def test_key_updates_are_all_or_nothing(own_gateway: RunningGateway) -> None:
    key_id, _ = own_gateway.create_key(name="before", rpm=5)
    with own_gateway.admin() as admin:
        response = admin.patch(f"/admin/keys/{key_id}", json={"name": "after", "rpm": "lots"})
        assert response.status_code == 400 and _error(response)["param"] == "rpm"
        response = admin.patch(f"/admin/keys/{key_id}", json={"name": "after", "models": ["nope"]})
        assert response.status_code == 400 and _error(response)["param"] == "models[0]"
        response = admin.patch(f"/admin/keys/{key_id}", json={"name": "after", "colour": "red"})
        assert response.status_code == 400 and _error(response)["param"] == "colour"
        shown = admin.get(f"/admin/keys/{key_id}").json()
    assert shown["name"] == "before" and shown["rpm"] == 5


@pytest.mark.parametrize(
    ("url", "param"),
    [
        ("/admin/keys?limit=0", "limit"),
        ("/admin/keys?limit=ten", "limit"),
        ("/admin/keys?limit=5&limit=6", "limit"),
        ("/admin/keys?status=lost", "status"),
        ("/admin/keys?colour=red", "colour"),
        ("/admin/usage?group_by=colour", "group_by"),
        ("/admin/usage?format=xml", "format"),
        ("/admin/usage?from=yesterday", "from"),
        ("/admin/usage?bogus=1", "bogus"),
        ("/admin/usage/events?limit=-1", "limit"),
        ("/admin/usage/events?key=a%20b", "key"),
        ("/admin/usage/events?cursor=zzz", "cursor"),
        ("/admin/usage/events?page=2", "page"),
    ],
)
def test_admin_query_strings_are_typed(own_gateway: RunningGateway, url: str, param: str) -> None:
    with own_gateway.admin() as admin:
        response = admin.get(url)
    assert response.status_code == 400, response.text
    assert _error(response)["param"] == param


def test_own_usage_query_is_typed(own_gateway: RunningGateway) -> None:
    _, key = own_gateway.create_key(name="usage-query")
    headers = {"Authorization": f"Bearer {key}"}
    for query, param in (("days=0", "days"), ("days=100000", "days"), ("weeks=2", "weeks")):
        response = httpx.get(own_gateway.v1 + "/usage?" + query, headers=headers)
        assert response.status_code == 400 and _error(response)["param"] == param


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"body": {"messages": [{"role": 7}]}}, "body.messages[0].role"),
        ({"body": {"metadata": {"task_type": ["x"]}}}, "body.metadata.task_type"),
        ({"body": {"model": ""}}, "body.model"),
        ({"body": {}, "headers": {"x-task-type": 1}}, "headers.x-task-type"),
        ({"body": {}, "allowed_models": "all"}, "allowed_models"),
        ({"body": {}, "key_id": 5}, "key_id"),
        ({"body": {}, "extra": True}, "extra"),
    ],
)
def test_explain_bodies_are_typed(own_gateway: RunningGateway, payload: dict, param: str) -> None:
    with own_gateway.admin() as admin:
        response = admin.post("/admin/route/explain", content=json.dumps(payload))
    assert response.status_code == 400, response.text
    assert _error(response)["param"] == param


def test_dashboard_says_503_while_redis_is_stopped(tmp_path, fake_policy, own_redis) -> None:
    # httpx keeps Secure cookies for https only; browsers also keep them on http://127.0.0.1.
    settings = make_settings(
        tmp_path / "data", fake_policy, own_redis.url, dashboard_cookie_secure=False
    )
    runner = GatewayThread(settings)
    gateway = runner.start()
    try:
        with httpx.Client(base_url=gateway.base_url, timeout=10) as browser:
            assert login(browser, ADMIN_KEY).status_code == 303
            assert browser.get("/admin/ui").status_code == 200
            own_redis.stop()
            page = browser.get("/admin/ui")
            assert page.status_code == 503, page.text
            assert page.headers["content-type"].startswith("text/html")
            assert page.headers["retry-after"] == "5"
            assert "Redis" in page.text and "unavailable" in page.text
            assert "Traceback" not in page.text
            api = browser.get("/admin/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            assert api.status_code == 503  # the same answer the API gives
            own_redis.start()
            assert browser.get("/admin/ui").status_code == 200
    finally:
        runner.stop()


def _aliases(count: int) -> str:
    return "a: &a x\nb: [" + ", ".join(["*a"] * count) + "]\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (_aliases(225_000), "at most 262144"),  # 900 KB, as in issue 26
        (_aliases(5_000), "more than 1000 aliases"),
    ],
    ids=["900 KB of aliases", "5000 aliases"],
)
def test_an_alias_flood_is_refused_naming_the_bound(
    own_gateway: RunningGateway, text: str, says: str
) -> None:
    before_version = own_gateway.services.policies.current.version
    with own_gateway.admin() as admin:
        for method, url in (("POST", "/admin/policy/validate"), ("PUT", "/admin/policy")):
            response = admin.request(
                method, url, content=text.encode(), headers={"content-type": "application/yaml"}
            )
            assert response.status_code == 400, (url, response.text)
            error = _error(response)
            assert error["code"] == "invalid_policy" and says in error["message"]
    assert own_gateway.services.policies.current.version == before_version


def test_a_policy_parse_does_not_hold_up_chat(own_gateway: RunningGateway, monkeypatch) -> None:
    """The parse of a validated policy is held until a chat request on the same gateway has
    been answered: that can only happen when the parse runs off the event loop."""
    import gateway.policy.parse as policy_module

    original = policy_module.load_yaml
    entered, chat_done = threading.Event(), threading.Event()
    seen: list[tuple[bool, bool]] = []

    def held_parse(*args, **kwargs):
        entered.set()
        answered = chat_done.wait(60)  # a deadline only so that a failing run ends
        seen.append((answered, asyncio_loop_running()))
        return original(*args, **kwargs)

    monkeypatch.setattr(policy_module, "load_yaml", held_parse)
    _, key = own_gateway.create_key(name="chat-beside-parse")
    text = own_gateway.settings.policy_file.read_text()
    results: dict[str, int] = {}

    def validate() -> None:
        with own_gateway.admin() as admin:
            response = admin.post(
                "/admin/policy/validate",
                content=text.encode(),
                headers={"content-type": "application/yaml"},
                timeout=120,
            )
        results["validate"] = response.status_code

    worker = threading.Thread(target=validate)
    worker.start()
    try:
        assert entered.wait(60), "the validate request never reached the parser"
        chat = httpx.post(
            own_gateway.v1 + "/chat/completions",
            json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        assert chat.status_code == 200, chat.text
        chat_done.set()
    finally:
        chat_done.set()
        worker.join(120)
    assert results == {"validate": 200}
    assert seen == [(True, False)]  # chat answered mid-parse; the parse had no event loop


def asyncio_loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
