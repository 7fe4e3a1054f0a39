"""Dashboard sessions and failed admin credentials on a real ``switchyard serve`` process:
sessions are server-side (logout ends one, an admin key change ends all), the cookie is Secure,
and wrong admin keys are throttled per client address and logged with it, never with the key.

Each test speaks from its own loopback address (127.0.0.x), so the per-address counters of one
gateway do not mix."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from dashboard_client import login, post_form
from fake_upstream import FakeUpstream, ThreadedFakeUpstream
from marked_gateway import ADMIN_KEY, MarkedGateway, write_policy

pytestmark = pytest.mark.slow

COOKIE = "sy_admin_session"
LIMIT = 10


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with ThreadedFakeUpstream() as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream):
    directory: Path = tmp_path_factory.mktemp("admin-sessions")
    process = MarkedGateway(
        directory / "data",
        write_policy(directory, upstream.base_url),
        auth_failure_limit=LIMIT,
        auth_failure_window_s=3600,
    ).start()
    try:
        yield process
    finally:
        process.stop()


def _client(gateway: MarkedGateway, address: str) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.base_url,
        transport=httpx.HTTPTransport(local_address=address),
        follow_redirects=False,
        timeout=10,
    )


def _login(client: httpx.Client, key: str) -> httpx.Response:
    return login(client, key)


def _page(client: httpx.Client, token: str) -> int:
    # Set by hand: the cookie is Secure, and httpx keeps those off plain http.
    return client.get("/admin/ui", headers={"cookie": f"{COOKIE}={token}"}).status_code


def _events(gateway: MarkedGateway, name: str) -> list[dict]:
    found = []
    for line in gateway.output().splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            event = orjson.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found


def test_sessions_are_random_and_end_at_logout(gateway: MarkedGateway) -> None:
    with _client(gateway, "127.0.0.2") as client:
        first, second = _login(client, ADMIN_KEY), _login(client, ADMIN_KEY)
        assert first.status_code == second.status_code == 303
        cookie = first.headers["set-cookie"].lower()
        for flag in ("secure", "httponly", "samesite=strict", "path=/admin"):
            assert flag in cookie
        token_a, token_b = first.cookies[COOKIE], second.cookies[COOKIE]
        assert token_a != token_b and len(token_a) >= 40  # two logins in one second differ
        assert _page(client, token_a) == _page(client, token_b) == 200
        out = post_form(client, token_a, "/admin/ui/logout")
        assert out.status_code == 303
        assert _page(client, token_a) == 401  # ended on the server, not only forgotten
        assert _page(client, token_b) == 200  # the other session lives on


def test_admin_key_change_ends_every_session(tmp_path: Path, upstream: FakeUpstream) -> None:
    gateway = MarkedGateway(tmp_path / "data", write_policy(tmp_path, upstream.base_url))
    gateway.start()
    try:
        with _client(gateway, "127.0.0.1") as client:
            token = _login(client, ADMIN_KEY).cookies[COOKIE]
            assert _page(client, token) == 200
        gateway.stop()
        # The same DATA_DIR and Redis (its AOF keeps the session), a new admin key.
        new_key = "sy-admin-rotated-0123456789abcdef"
        gateway.env["SWITCHYARD_ADMIN_KEY"] = new_key
        gateway.start()
        with _client(gateway, "127.0.0.1") as client:
            assert _page(client, token) == 401
            assert _login(client, ADMIN_KEY).status_code == 401
            assert _page(client, _login(client, new_key).cookies[COOKIE]) == 200
    finally:
        gateway.stop()


def test_cookie_secure_can_be_turned_off_for_plain_http(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    gateway = MarkedGateway(
        tmp_path / "data",
        write_policy(tmp_path, upstream.base_url),
        dashboard_cookie_secure="false",
    ).start()
    try:
        with _client(gateway, "127.0.0.1") as client:
            login = _login(client, ADMIN_KEY)
            assert "secure" not in login.headers["set-cookie"].lower()
            assert client.get("/admin/ui").status_code == 200  # httpx sends it back itself
    finally:
        gateway.stop()


def test_wrong_logins_are_throttled_and_logged_by_address(gateway: MarkedGateway) -> None:
    guesses = [f"sy-admin-guess-{n:04d}-abcdefghij" for n in range(200)]
    started = time.monotonic()
    with _client(gateway, "127.0.0.3") as client:
        replies = [_login(client, guess) for guess in guesses]
        took_s = time.monotonic() - started
        statuses = Counter(reply.status_code for reply in replies)
        assert statuses == {401: LIMIT, 429: 200 - LIMIT}, statuses
        refused = replies[-1]
        assert 3500 <= int(refused.headers["retry-after"]) <= 3600
        assert "Too many failed admin credentials" in refused.text
        # While throttled, even the right key is refused: guessing stops, it does not slow down.
        assert _login(client, ADMIN_KEY).status_code == 429
    print(f"200 wrong logins: {dict(statuses)} in {took_s:.2f}s")
    with _client(gateway, "127.0.0.4") as elsewhere:  # another address is not affected
        assert _login(elsewhere, ADMIN_KEY).status_code == 303

    failures = [e for e in _events(gateway, "admin_auth_failed") if e["client"] == "127.0.0.3"]
    assert len(failures) == LIMIT
    assert {e["what"] for e in failures} == {"dashboard_login"}
    assert [e["failures"] for e in failures] == list(range(1, LIMIT + 1))
    throttled = [e for e in _events(gateway, "admin_auth_throttled") if e["client"] == "127.0.0.3"]
    assert len(throttled) == 1
    output = gateway.output()
    assert not any(guess in output for guess in guesses)  # never the attempted secret


def test_wrong_admin_bearers_are_throttled_too(gateway: MarkedGateway) -> None:
    with _client(gateway, "127.0.0.5") as client:
        statuses = [
            client.get(
                "/admin/keys", headers={"Authorization": f"Bearer wrong-admin-key-{n}"}
            ).status_code
            for n in range(LIMIT + 5)
        ]
        assert statuses == [403] * LIMIT + [429] * 5, statuses
        right = client.get("/admin/keys", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert right.status_code == 429 and int(right.headers["retry-after"]) > 0
        assert right.json()["error"]["code"] == "too_many_auth_failures"
        missing = client.get("/admin/keys")  # no credentials: a 401, nothing to count
        assert missing.status_code == 401
    failures = [e for e in _events(gateway, "admin_auth_failed") if e["client"] == "127.0.0.5"]
    assert len(failures) == LIMIT and {e["what"] for e in failures} == {"admin_bearer"}
    assert "wrong-admin-key" not in gateway.output()
    with gateway.admin() as admin:  # 127.0.0.1 still gets in
        assert admin.get("/admin/keys").status_code == 200
        metrics = httpx.get(gateway.base_url + "/metrics").text
    assert 'switchyard_admin_auth_failures_total{what="admin_bearer"}' in metrics
