"""Labels that reach the usage ledger (a key's name and team, a team's and a token's name, the
end user and tags of a request) are checked where they enter, by the ledger's own rule: a
label the store would refuse is a 400 naming the field, at the admin API, the dashboard's
forms, the CLI and the /v1 doors alike, and a label it accepts is stored as given."""

from __future__ import annotations

import httpx
import openai
import pytest
from dashboard_client import login, post_form
from gateway_runner import ADMIN_KEY, RunningGateway

from gateway.cli import main

# Each breaks the rule in its own way: C0 and C1 controls, DEL, a Unicode line separator.
UNPRINTABLE = ["tab\there", "new\nline", "bell\x07", "del\x7f", "c1\x85", "sep\u2028x"]


def _refused(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def _chat(gateway: RunningGateway, key: str, **extra: object) -> object:
    client = openai.OpenAI(base_url=gateway.v1, api_key=key, max_retries=0)
    return client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], **extra
    )


def test_the_attack_a_tab_in_a_team_is_refused_at_key_creation(gateway: RunningGateway) -> None:
    """Issue 26's report: this key was accepted and all of its usage was dropped later."""
    with gateway.admin() as admin:
        message = _refused(
            admin.post("/admin/keys", json={"name": "x", "team": "tab\there"}), "team"
        )
        assert "control characters" in message
        listed = admin.get("/admin/keys", params={"limit": 1000}).json()["data"]
        assert not [key for key in listed if key.get("team") == "tab\there"]  # nothing made


@pytest.mark.parametrize("label", UNPRINTABLE, ids=repr)
def test_every_admin_entry_refuses_an_unprintable_label(
    gateway: RunningGateway, label: str
) -> None:
    key_id, _ = gateway.create_key(name="labelled", team="fine")
    with gateway.admin() as admin:
        _refused(admin.post("/admin/keys", json={"name": label}), "name")
        _refused(admin.post("/admin/keys", json={"team": label}), "team")
        _refused(admin.patch(f"/admin/keys/{key_id}", json={"team": label}), "team")
        _refused(admin.patch(f"/admin/keys/{key_id}", json={"name": label}), "name")
        _refused(admin.post("/admin/teams", json={"id": "labels-t", "name": label}), "name")
        _refused(admin.post("/admin/tokens", json={"name": label, "role": "viewer"}), "name")
        _refused(
            admin.post("/admin/keys", json={"tags": [label + "z"]}), "tags"
        )  # tags are stripped
        shown = admin.get(f"/admin/keys/{key_id}").json()
        assert (shown["name"], shown["team"]) == ("labelled", "fine")  # nothing half-applied
        assert admin.get("/admin/teams/labels-t").status_code == 404


def test_a_v1_request_with_an_unprintable_end_user_or_tag_is_refused(
    gateway: RunningGateway, key: str
) -> None:
    for extra, param in (
        ({"user": "tab\there"}, "user"),
        ({"user": "sep\u2028x"}, "user"),
        ({"extra_body": {"metadata": {"tags": ["a\tb"]}}}, "metadata.tags"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            _chat(gateway, key, **extra)
        assert refused.value.status_code == 400
        assert refused.value.body["param"] == param, refused.value.body


def test_the_dashboard_form_refuses_an_unprintable_team(gateway: RunningGateway) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=30) as browser:
        token = login(browser, ADMIN_KEY).cookies["sy_admin_session"]
        page = post_form(browser, token, "/admin/ui/keys", {"name": "form", "team": "tab\there"})
        assert page.status_code == 400 and 'data-param="team"' in page.text


def test_the_cli_refuses_an_unprintable_team(
    monkeypatch, capsys, tmp_path, fake_policy, redis_url: str, gateway: RunningGateway
) -> None:
    from gateway_runner import PEPPER

    monkeypatch.setenv("SWITCHYARD_REDIS_URL", redis_url)
    monkeypatch.setenv("SWITCHYARD_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SWITCHYARD_KEY_PEPPER", PEPPER)
    monkeypatch.setenv("SWITCHYARD_POLICY_FILE", str(fake_policy))
    assert main(["keys", "create", "--name", "cli", "--team", "tab\there"]) == 1
    assert "team" in capsys.readouterr().err


def test_a_printable_label_is_stored_as_given(gateway: RunningGateway) -> None:
    """The rule refuses only what the ledger cannot keep: accents, spaces, CJK are fine."""
    team, user = "équipe α 漢", "ünïcode user"
    key_id, key = gateway.create_key(name="名前 x", team=team)
    _chat(gateway, key, user=user)
    gateway.wait_exported()
    with gateway.admin() as admin:
        events = admin.get("/admin/usage/events", params={"key": key_id}).json()["data"]
    assert [(e["team"], e["end_user"]) for e in events] == [(team, user)]
