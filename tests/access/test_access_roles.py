"""Named admin tokens, their roles and the audit log, on a real ``switchyard serve`` process
whose admin key and pepper are marked (``OPSSECRET``): a viewer reads reports and nothing
more, an operator manages keys but not the policy or tokens, every change is in the audit log
with who made it and from where, and no secret ever reaches the log. The dashboard accepts the
same tokens, shows each role its pages only, and refuses a form without its CSRF token."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from dashboard_client import login, post_form, session_headers
from fake_upstream import ThreadedFakeUpstream
from marked_gateway import ADMIN_KEY, PEPPER, MarkedGateway, write_policy

pytestmark = pytest.mark.slow
SECRET_SHAPES = re.compile(r"sk-sy-|sy-tok-|sy-admin-|OPSSECRET|secret_hash|previous_hash|salt")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MarkedGateway]:
    directory: Path = tmp_path_factory.mktemp("roles")
    with ThreadedFakeUpstream() as upstream:
        process = MarkedGateway(directory / "data", write_policy(directory, upstream.base_url))
        process.start()
        try:
            yield process
        finally:
            process.stop()


def _client(gateway: MarkedGateway, bearer: str, address: str = "127.0.0.1") -> httpx.Client:
    return httpx.Client(
        base_url=gateway.base_url,
        headers={"Authorization": f"Bearer {bearer}"},
        transport=httpx.HTTPTransport(local_address=address),
        follow_redirects=False,
        timeout=15,
    )


def _token(gateway: MarkedGateway, name: str, role: str) -> tuple[str, str]:
    with gateway.admin() as admin:
        created = admin.post("/admin/tokens", json={"name": name, "role": role})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["token"].startswith("sy-tok-") and body["role"] == role
    return body["id"], body["token"]


def _audit(gateway: MarkedGateway, **filters: str) -> list[dict]:
    with gateway.admin() as admin:
        listed = admin.get("/admin/audit", params=filters)
    assert listed.status_code == 200, listed.text
    assert not SECRET_SHAPES.search(listed.text), listed.text
    return listed.json()["data"]


def test_a_viewer_reads_reports_and_cannot_create_keys(gateway: MarkedGateway) -> None:
    _, viewer = _token(gateway, "finance-dash", "viewer")
    with _client(gateway, viewer, "127.0.0.21") as client:
        assert client.get("/admin/usage").status_code == 200
        assert client.get("/admin/usage/events").status_code == 200
        refused = client.post("/admin/keys", json={"name": "sneaky"})
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "insufficient_role"
        assert "needs the operator role" in refused.json()["error"]["message"]
        for method, path in (("GET", "/admin/keys"), ("GET", "/admin/teams"),
                             ("GET", "/admin/audit"), ("PUT", "/admin/policy")):  # fmt: skip
            assert client.request(method, path).status_code == 403, path
    with gateway.admin() as admin:  # nothing was made
        names = {k["name"] for k in admin.get("/admin/keys", params={"limit": 1000}).json()["data"]}
    assert "sneaky" not in names
    # A known token with too low a role is not a failed credential: nothing was counted.
    failures = [
        event
        for line in gateway.output().splitlines()
        if line.startswith("{")
        and (event := orjson.loads(line)).get("event") == "admin_auth_failed"
    ]
    assert not [event for event in failures if event.get("client") == "127.0.0.21"]


def test_an_operators_rotation_is_in_the_audit_log_without_secrets(
    gateway: MarkedGateway,
) -> None:
    operator_id, operator = _token(gateway, "ops-bot", "operator")
    with _client(gateway, operator, "127.0.0.22") as client:
        created = client.post("/admin/keys", json={"name": "rotated-by-ops", "rpm": 60})
        assert created.status_code == 201
        key_id, old_secret = created.json()["id"], created.json()["key"]
        rotated = client.post(f"/admin/keys/{key_id}/rotate", json={"grace_seconds": 60})
        assert rotated.status_code == 200
        new_secret = rotated.json()["key"]
        # Keys and teams are the operator's; the policy and tokens are not.
        assert client.post("/admin/teams", json={"id": "ops-team"}).status_code == 201
        assert client.put("/admin/policy", content=b"{}").status_code == 403
        assert client.post("/admin/tokens", json={"name": "x", "role": "admin"}).status_code == 403

    entries = _audit(gateway, action="key.rotate", target=f"key:{key_id}")
    assert len(entries) == 1
    entry = entries[0]
    assert entry["actor_kind"] == "token"
    assert (entry["actor_id"], entry["actor_name"], entry["actor_role"]) == (
        operator_id,
        "ops-bot",
        "operator",
    )
    assert entry["client"] == "127.0.0.22" and entry["request_id"]
    assert entry["before"]["id"] == entry["after"]["id"] == key_id
    assert entry["before"]["rotated_at"] is None and entry["after"]["rotated_at"] is not None
    assert entry["after"]["previous_secret_valid_until"] is not None
    serialized = orjson.dumps(entries).decode()
    for secret in (old_secret, new_secret, operator, ADMIN_KEY, PEPPER):
        assert secret not in serialized

    mine = _audit(gateway, actor="ops-bot")  # by name, or by id: the same entries
    assert [e["event_id"] for e in mine] == [
        e["event_id"] for e in _audit(gateway, actor=operator_id)
    ]
    assert [e["action"] for e in mine] == ["team.create", "key.rotate", "key.create"]
    with gateway.admin() as admin:
        as_csv = admin.get("/admin/audit", params={"actor": "ops-bot", "format": "csv"})
    assert as_csv.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [row["action"] for row in rows] == ["team.create", "key.rotate", "key.create"]
    assert not SECRET_SHAPES.search(as_csv.text)
    # Tokens are made and revoked by admins, in the log too; a revoked token is refused at once.
    _audit(gateway, action="token.create", target=f"token:{operator_id}")
    with gateway.admin() as admin:
        assert admin.post(f"/admin/tokens/{operator_id}/revoke").json()["status"] == "revoked"
    with _client(gateway, operator, "127.0.0.23") as client:
        gone = client.get("/admin/keys")
        assert gone.status_code == 403 and gone.json()["error"]["code"] == "admin_key_required"
    assert '"client":"127.0.0.23"' in gateway.output().replace(" ", "")  # counted as a failure
    assert len(_audit(gateway, action="token.revoke", target=f"token:{operator_id}")) == 1


def test_the_dashboard_takes_tokens_shows_each_role_its_pages_and_wants_csrf(
    gateway: MarkedGateway,
) -> None:
    _, viewer = _token(gateway, "viewer-in-browser", "viewer")
    _, operator = _token(gateway, "operator-in-browser", "operator")
    with httpx.Client(base_url=gateway.base_url, follow_redirects=False, timeout=15) as browser:
        as_viewer = login(browser, viewer).cookies["sy_admin_session"]
        page = browser.get("/admin/ui", headers=session_headers(as_viewer))
        assert page.status_code == 200 and 'data-role="viewer"' in page.text
        assert "/admin/ui/keys" not in page.text  # no link to what a viewer may not do
        assert browser.get("/admin/ui/keys", headers=session_headers(as_viewer)).status_code == 403
        assert post_form(browser, as_viewer, "/admin/ui/keys", {"name": "v"}).status_code == 403

        as_operator = login(browser, operator).cookies["sy_admin_session"]
        keys_page = browser.get("/admin/ui/keys", headers=session_headers(as_operator))
        assert keys_page.status_code == 200 and 'data-role="operator"' in keys_page.text
        with gateway.admin() as admin:
            before = len(admin.get("/admin/keys", params={"limit": 1000}).json()["data"])
        # A form without the session's CSRF token, or with another session's, changes nothing.
        forged = browser.post(
            "/admin/ui/keys", data={"name": "forged"}, headers=session_headers(as_operator)
        )
        assert forged.status_code == 403 and "CSRF" in forged.text
        viewer_token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
        borrowed = browser.post(
            "/admin/ui/keys",
            data={"name": "forged", "csrf": viewer_token},
            headers=session_headers(as_operator),
        )
        assert borrowed.status_code == 403
        with gateway.admin() as admin:
            after = len(admin.get("/admin/keys", params={"limit": 1000}).json()["data"])
        assert after == before

        made = post_form(browser, as_operator, "/admin/ui/keys", {"name": "from-the-page"})
        assert made.status_code == 201
        shown = re.search(r"<code class=\"secret\" data-secret>([^<]+)</code>", made.text).group(1)
        assert shown.startswith("sk-sy-")
        again = browser.get("/admin/ui/keys", headers=session_headers(as_operator))
        assert "from-the-page" in again.text and shown not in again.text  # shown once
        logins = _audit(gateway, action="dashboard.login", actor="operator-in-browser")
        assert logins and logins[0]["client"] == "127.0.0.1"
        made_entries = _audit(gateway, action="key.create", actor="operator-in-browser")
        assert made_entries[0]["after"]["name"] == "from-the-page"
