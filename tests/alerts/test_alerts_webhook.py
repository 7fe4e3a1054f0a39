"""Issue 18, budget alerts, through two ``switchyard serve`` processes on one Redis.

A key with a soft budget and a team with a hard one, both with alert thresholds, spend past
them; a loopback webhook receiver refuses its first two tries. Each threshold is delivered
exactly once (one 2xx per alert id, the failed tries retried with backoff), every body signed
with HMAC-SHA256; the soft budget never refuses, the hard one does."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
import redis
from gateway_runner import running_gateways
from replica_load import chat

from gateway.alerts.outbox import OUTBOX_KEY

pytestmark = pytest.mark.slow
SECRET = "alert-secret-0123456789"
COST_NANOS = 20_000_000  # a chat of replica_load: $0.02


class Receiver:
    """A webhook on 127.0.0.1 that answers 500 to its first ``fail_first`` tries."""

    def __init__(self, fail_first: int) -> None:
        self.tries: list[tuple[int, dict[str, str], bytes]] = []  # (status, headers, body)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                with receiver.lock:
                    status = 500 if len(receiver.tries) < fail_first else 204
                    receiver.tries.append((status, dict(self.headers.items()), body))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def accepted(self) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return [(headers, body) for status, headers, body in self.tries if status == 204]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver(fail_first=2)
    yield hook
    hook.server.shutdown()


def _wait_for(predicate, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.1)


def test_each_threshold_is_delivered_once_signed_despite_failed_tries(
    tmp_path: Path, fake_policy: Path, redis_url: str, receiver: Receiver
) -> None:
    with running_gateways(
        2,
        tmp_path,
        fake_policy,
        redis_url=redis_url,
        upstream_max_tries=1,
        access_log="false",
        alert_webhook_url=receiver.url,
        alert_webhook_secret=SECRET,
        alert_retry_initial_s=0.2,
        alert_timeout_s=1,
    ) as gateways:
        # A soft $0.10 a day: 7 requests of $0.02 are all served, crossing 50, 80 and 100 %.
        soft_id, soft_key = gateways[0].create_key(
            name="soft",
            budget_usd=0.1,
            budget_period="day",
            budget_mode="soft",
            alert_thresholds=[80, 50, 100],
        )
        served = [chat(gateways[i % 2].url, soft_key).status_code for i in range(7)]
        assert served == [200] * 7
        # A hard $0.17 a day on a team: after 3 requests ($0.06) the 4th one's hold (its bound,
        # $0.129) no longer fits the $0.11 left, so it is refused; 10 and 30 % alert.
        with gateways[1].admin() as admin:
            made = admin.post(
                "/admin/teams",
                json={
                    "id": "alerting",
                    "budgets_usd": {"day": 0.17},
                    "alert_thresholds": [10, 30],
                },
            )
        assert made.status_code == 201, made.text
        assert made.json()["budget_mode"] == "hard"
        team_key = gateways[1].create_key(name="member", team="alerting")[1]
        answers = [chat(gateways[i % 2].url, team_key) for i in range(4)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert answers[3].json()["error"]["type"] == "insufficient_quota"

        _wait_for(lambda: len(receiver.accepted()) >= 5, 30)
        time.sleep(1.5)  # a repeat, if there were one, would arrive by now
        accepted = receiver.accepted()
        logs = "".join(g.output() for g in gateways)

    bodies = [orjson.loads(body) for _, body in accepted]
    ids = [body["id"] for body in bodies]
    assert len(ids) == 5 and len(set(ids)) == 5  # each alert accepted exactly once
    assert len(receiver.tries) == 7  # the two refused tries were retried, nothing else repeated
    failed_ids = {h["x-switchyard-alert-id"] for status, h, _ in receiver.tries if status == 500}
    assert failed_ids <= set(ids)
    assert "alert_delivery_failed" in logs and "alert_delivered" in logs
    for headers, body in accepted:
        timestamp = headers["x-switchyard-timestamp"]
        mac = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
        assert headers["x-switchyard-signature"] == "v1=" + mac.hexdigest()
        assert headers["x-switchyard-alert-id"] == orjson.loads(body)["id"]
    crossed = {
        (b["scope"], b["threshold_percent"]): (b["spent_nanos"], b["budget_nanos"]) for b in bodies
    }
    assert crossed == {
        ("key", 50): (3 * COST_NANOS, 5 * COST_NANOS),
        ("key", 80): (4 * COST_NANOS, 5 * COST_NANOS),
        ("key", 100): (5 * COST_NANOS, 5 * COST_NANOS),
        ("team", 10): (1 * COST_NANOS, 170_000_000),
        ("team", 30): (3 * COST_NANOS, 170_000_000),
    }
    assert {b["scope_id"] for b in bodies if b["scope"] == "team"} == {"alerting"}
    assert {b["scope_id"] for b in bodies if b["scope"] == "key"} == {soft_id}
    # The soft budget kept counting past its limit, and the outbox is empty.
    client = redis.Redis.from_url(redis_url)
    assert int(client.hget(f"sy:{{key:{soft_id}}}:budget:day", "spent")) == 7 * COST_NANOS
    assert client.xlen(OUTBOX_KEY) == 0
