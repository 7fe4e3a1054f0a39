"""Every routed request leaves a usage record (settled in the same pipeline as its limits), and
the usage, policy and dashboard handlers are mounted behind the right authentication."""

from __future__ import annotations

import time

import httpx
import openai
from dashboard_client import login
from gateway_runner import ADMIN_KEY, RunningGateway

HI = [{"role": "user", "content": "hi"}]


def _usage(gateway: RunningGateway, key: str) -> dict:
    response = httpx.get(gateway.v1 + "/usage", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def _wait_for_requests(gateway: RunningGateway, key: str, count: int) -> dict:
    deadline = time.monotonic() + 5
    while True:
        usage = _usage(gateway, key)
        if usage["requests"] >= count or time.monotonic() > deadline:
            return usage
        time.sleep(0.05)


def test_requests_are_recorded_with_tokens_cost_and_errors(gateway: RunningGateway) -> None:
    key_id, key = gateway.create_key(name="metered", team="usage-team", rpm=1000)
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    client.chat.completions.create(model="fake", messages=HI, max_tokens=7)  # type: ignore[arg-type]
    list(client.chat.completions.create(model="fake", messages=HI, max_tokens=3, stream=True))  # type: ignore[arg-type]
    failed = httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": "upstream-500", "messages": HI},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert failed.status_code == 502
    usage = _wait_for_requests(gateway, key, 3)
    assert usage["key_id"] == key_id
    assert usage["requests"] == 3 and usage["errors"] == 1
    assert usage["prompt_tokens"] == 20 and usage["completion_tokens"] == 10
    # fake-model: 10 prompt × $1000/M + n completion × $2000/M, for n = 7 and 3
    assert usage["total_cost_nanos"] == 2 * 10_000_000 + 10 * 2_000_000
    assert {row["model"] for row in usage["by_model"]} == {"fake-model", "upstream-500"}


def test_usage_of_another_key_is_not_visible(gateway: RunningGateway) -> None:
    _, first = gateway.create_key(name="a")
    _, second = gateway.create_key(name="b")
    httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": "fake", "messages": HI},
        headers={"Authorization": f"Bearer {first}"},
    )
    assert _wait_for_requests(gateway, first, 1)["requests"] == 1
    assert _usage(gateway, second)["requests"] == 0
    assert httpx.get(gateway.v1 + "/usage").status_code == 401


def test_admin_usage_and_policy_need_the_admin_key(gateway: RunningGateway, key: str) -> None:
    for path in ("/admin/usage", "/admin/usage/events", "/admin/policy"):
        assert httpx.get(gateway.base_url + path).status_code == 401
        forbidden = httpx.get(gateway.base_url + path, headers={"Authorization": f"Bearer {key}"})
        assert forbidden.status_code == 403
    with gateway.admin() as admin:
        report = admin.get("/admin/usage", params={"group_by": "team"})
        assert report.status_code == 200 and "data" in report.json()
        assert admin.get("/admin/usage", params={"group_by": "nope"}).status_code == 400
        policy = admin.get("/admin/policy").json()
        assert policy["version"] and "fake-model" in policy["policy"]["models"]
        explained = admin.post(
            "/admin/route/explain",
            json={"body": {"model": "fake", "messages": HI}, "headers": {}},
        )
        assert explained.status_code == 200
        assert explained.json()["candidates"][0]["model"] == "fake-model"


def test_dashboard_login_page_and_session(gateway: RunningGateway) -> None:
    with httpx.Client(base_url=gateway.base_url, follow_redirects=False) as browser:
        page = browser.get("/admin/ui")
        assert page.status_code in (200, 401) and "<form" in page.text
        assert login(browser, "wrong").status_code == 401
        # Without the login form's CSRF token nothing is checked, not even the key.
        assert browser.post("/admin/ui/login", data={"key": ADMIN_KEY}).status_code == 403
        signed_in = login(browser, ADMIN_KEY)
        assert signed_in.status_code == 303
        # Secure by default: a client must hand it back itself over plain http (httpx will not).
        assert "secure" in signed_in.headers["set-cookie"].lower()
        session = {"cookie": f"sy_admin_session={signed_in.cookies['sy_admin_session']}"}
        dashboard = browser.get("/admin/ui", headers=session)
        assert dashboard.status_code == 200 and "<svg" in dashboard.text
