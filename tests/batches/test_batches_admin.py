"""Admins see every key's batches: ``/admin/batches`` (list, show, cancel, in the audit log),
``switchyard batches list|show|cancel``, the dashboard's batches page, and the batch's usage
in ``/admin/usage?group_by=batch`` priced at the batch price."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from batch_support import chat_jsonl, wait_until
from dashboard_client import login, session_headers
from gateway_runner import GatewayThread, RunningGateway, make_settings
from loopback import ServedOnThread
from slow_upstream import COMPLETION_TOKENS, PROMPT_TOKENS, SlowUpstream, slow_policy

from gateway.cli import main

LINES = 5


@pytest.fixture(scope="module")
def upstream() -> Iterator[SlowUpstream]:
    with ServedOnThread(SlowUpstream(delay_s=0.0)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, upstream: SlowUpstream
) -> Iterator[RunningGateway]:
    root: Path = tmp_path_factory.mktemp("batches-admin")
    policy = root / "routing_rules.yaml"
    policy.write_text(slow_policy(upstream.url))
    settings = make_settings(root / "data", policy, redis_url, batch_poll_interval_s=0.05)
    with GatewayThread(settings) as running:
        yield running


def run_batch(gateway: RunningGateway, key: str) -> str:
    client = openai.OpenAI(api_key=key, base_url=gateway.v1, max_retries=0)
    data = chat_jsonl(LINES, model=lambda _: "slow-model")
    uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until(
        lambda: client.batches.retrieve(batch.id).status == "completed", 30, "the batch to end"
    )
    return batch.id


def test_admins_list_show_and_read_the_usage_of_every_keys_batches(
    gateway: RunningGateway,
) -> None:
    key_id, key = gateway.create_key(name="admin-view")
    batch_id = run_batch(gateway, key)
    with gateway.admin() as admin:
        listed = admin.get("/admin/batches", params={"key": key_id}).json()
        (row,) = listed["data"]
        assert (row["id"], row["api"], row["key_id"], row["status"]) == (
            batch_id, "openai", key_id, "completed",
        )  # fmt: skip
        assert row["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
        assert admin.get(f"/admin/batches/{batch_id}").json()["id"] == batch_id
        assert admin.get("/admin/batches/batch_nope").status_code == 404
        gateway.wait_exported()
        usage = admin.get("/admin/usage", params={"group_by": "batch"}).json()
    (spent,) = [item for item in usage["data"] if item["batch"] == batch_id]
    # slow-model: $1 / $2 per Mtok, its batch price $0.5 / $1: 500 and 1000 nano-dollars a token.
    assert spent["requests"] == LINES
    assert spent["cost_nanos"] == LINES * (PROMPT_TOKENS * 500 + COMPLETION_TOKENS * 1000)


def test_an_admin_cancel_is_in_the_audit_log(
    gateway: RunningGateway, upstream: SlowUpstream
) -> None:
    upstream.delay_s = 1.0
    try:
        _, key = gateway.create_key(name="admin-cancel")
        client = openai.OpenAI(api_key=key, base_url=gateway.v1, max_retries=0)
        data = chat_jsonl(40, model=lambda _: "slow-model")
        uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        with gateway.admin() as admin:
            cancelled = admin.post(f"/admin/batches/{batch.id}/cancel")
            assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelling"
            audit = admin.get("/admin/audit", params={"action": "batch.cancel"}).json()
        assert audit["data"][0]["target"] == f"batch:{batch.id}"
        wait_until(
            lambda: client.batches.retrieve(batch.id).status == "cancelled", 30, "the cancel"
        )
    finally:
        upstream.delay_s = 0.0


def test_the_cli_and_the_dashboard_show_batches(
    gateway: RunningGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    _, key = gateway.create_key(name="cli-view")
    batch_id = run_batch(gateway, key)
    where = ["--url", gateway.base_url, "--admin-key", gateway.admin_key]
    assert main(["batches", "list", *where]) == 0
    table = capsys.readouterr().out
    assert batch_id in table and "completed" in table.split(batch_id, 1)[1].splitlines()[0]
    assert main(["batches", "show", batch_id, *where]) == 0
    assert f'"id": "{batch_id}"' in capsys.readouterr().out
    assert main(["batches", "cancel", batch_id, *where]) == 1  # completed: nothing to cancel
    assert "409" in capsys.readouterr().err

    with httpx.Client(base_url=gateway.base_url) as browser:
        signed_in = login(browser, gateway.admin_key)
        token = signed_in.cookies.get("sy_admin_session") or ""
        page = browser.get("/admin/ui/batches", headers=session_headers(token))
    assert page.status_code == 200
    assert f'data-batch-id="{batch_id}" data-status="completed"' in page.text
