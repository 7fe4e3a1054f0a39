"""A batch stopped mid-run keeps what it answered: a cancel (``cancelling`` → ``cancelled``, no
upstream call after it), the end of its window (``expired``). And batch lines take only what
interactive traffic leaves: half the key's RPM by default, and a pause after a 429."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from batch_support import chat_jsonl, jsonl, wait_until
from gateway_runner import GatewayThread, RunningGateway, make_settings
from loopback import ServedOnThread
from slow_upstream import SlowUpstream, slow_policy

from gateway.batches.store import make_batch_store

CONCURRENCY = 4
FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def upstream() -> Iterator[SlowUpstream]:
    with ServedOnThread(SlowUpstream()) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, upstream: SlowUpstream
) -> Iterator[RunningGateway]:
    root: Path = tmp_path_factory.mktemp("batches-lifecycle")
    policy = root / "routing_rules.yaml"
    policy.write_text(slow_policy(upstream.url))
    settings = make_settings(
        root / "data",
        policy,
        redis_url,
        batch_poll_interval_s=0.05,
        batch_concurrency=CONCURRENCY,
        upstream_read_timeout_s=30,
    )
    with GatewayThread(settings) as running:
        yield running


def start_batch(gateway: RunningGateway, key: str, lines: int, tag: str) -> tuple[Any, Any]:
    client = openai.OpenAI(api_key=key, base_url=gateway.v1, max_retries=0)
    data = chat_jsonl(lines, model=lambda _: "slow-model").replace(b"question", tag.encode())
    uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return client, batch


def ended(client: openai.OpenAI, batch_id: str, timeout_s: float = 30) -> Any:
    def done() -> Any:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in FINAL else None

    return wait_until(done, timeout_s, f"batch {batch_id} to end")


def tags_of(upstream: SlowUpstream, prefix: str) -> list[str]:
    return [tag for tag in upstream.arrivals if tag.startswith(prefix)]


def test_a_cancel_stops_new_calls_at_once_and_keeps_the_answers_in_flight(
    gateway: RunningGateway, upstream: SlowUpstream
) -> None:
    upstream.delay_s = 1.5
    _, key = gateway.create_key(name="cancel")
    client, batch = start_batch(gateway, key, 40, "cancel")
    # Every slot busy upstream: the runner can start no other line until one ends.
    wait_until(lambda: len(tags_of(upstream, "cancel")) == CONCURRENCY, 10, "lines in flight")
    cancelled = client.batches.cancel(batch.id)
    answered_at = time.monotonic()
    assert cancelled.status == "cancelling" and cancelled.cancelling_at
    in_flight = tags_of(upstream, "cancel")

    batch = ended(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    time.sleep(0.5)
    assert [t for t in upstream.arrived_after(answered_at) if t.startswith("cancel")] == []
    assert tags_of(upstream, "cancel") == in_flight
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (40, CONCURRENCY, 0)
    output = jsonl(client.files.content(batch.output_file_id).text)
    assert sorted(
        line["response"]["body"]["choices"][0]["message"]["content"] for line in output
    ) == sorted(f"answer to {tag}" for tag in in_flight)
    errors = jsonl(client.files.content(batch.error_file_id).text)
    assert len(errors) == 40 - CONCURRENCY
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert {line["response"] for line in errors} == {None}
    # Cancelling again answers the batch as it is; a finished one cannot be cancelled.
    assert client.batches.cancel(batch.id).status == "cancelled"


def test_a_batch_past_its_window_expires_with_its_answers_kept(
    gateway: RunningGateway, upstream: SlowUpstream
) -> None:
    upstream.delay_s = 0.8
    _, key = gateway.create_key(name="expire")
    client, batch = start_batch(gateway, key, 20, "expire")
    wait_until(lambda: len(tags_of(upstream, "expire")) == CONCURRENCY, 10, "lines in flight")

    async def end_the_window() -> None:  # as if 24 hours had passed
        store = make_batch_store("", data_dir=gateway.settings.data_dir)
        await store.open()
        try:
            await store.expire_at(batch.id, int(time.time() * 1000))
        finally:
            await store.close()

    asyncio.run(end_the_window())
    batch = ended(client, batch.id)
    assert batch.status == "expired" and batch.expired_at
    started = tags_of(upstream, "expire")
    assert batch.request_counts.completed == len(started) >= CONCURRENCY
    output = jsonl(client.files.content(batch.output_file_id).text)
    errors = jsonl(client.files.content(batch.error_file_id).text)
    assert len(output) == len(started) and len(output) + len(errors) == 20
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}


def test_batch_lines_leave_half_the_keys_rpm_to_interactive_requests(
    gateway: RunningGateway, upstream: SlowUpstream, tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
) -> None:  # fmt: skip
    upstream.delay_s = 0.0
    # One line at a time: the share is checked before each line's reserve, so the lines of one
    # replica that pass it together may overshoot it by up to the runner's concurrency.
    root = tmp_path_factory.mktemp("headroom")
    batches = gateway.settings.batches.model_copy(update={"concurrency": 1, "limit_share": 0.5})
    settings = gateway.settings.model_copy(update={"data_dir": root, "batches": batches})
    with GatewayThread(settings) as single:
        _, key = single.create_key(name="headroom", rpm=6)
        client, batch = start_batch(single, key, 6, "headroom")
        wait_until(lambda: len(tags_of(upstream, "headroom")) == 3, 10, "half the rpm")
        time.sleep(1.0)
        assert len(tags_of(upstream, "headroom")) == 3  # the batch waits for the window
        assert client.batches.retrieve(batch.id).status == "in_progress"
        chat = [{"role": "user", "content": "interactive"}]
        for _ in range(3):  # the other half is the interactive requests'
            client.chat.completions.create(model="slow-model", messages=chat)  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="slow-model", messages=chat)  # type: ignore[arg-type]
        client.batches.cancel(batch.id)
        batch = ended(client, batch.id)
        assert (batch.status, batch.request_counts.completed) == ("cancelled", 3)


def test_a_429_gives_the_line_back_and_it_is_answered_after_a_pause(
    gateway: RunningGateway, upstream: SlowUpstream
) -> None:
    upstream.delay_s = 0.0
    upstream.throttle = {"throttled 0", "throttled 1"}
    _, key = gateway.create_key(name="throttled")
    client, batch = start_batch(gateway, key, 4, "throttled")
    batch = ended(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 4
    arrivals = tags_of(upstream, "throttled")
    assert sorted(arrivals) == sorted(
        ["throttled 0", "throttled 0", "throttled 1", "throttled 1", "throttled 2", "throttled 3"]
    )
    output = jsonl(client.files.content(batch.output_file_id).text)
    assert sorted(line["custom_id"] for line in output) == [f"line-{i}" for i in range(4)]
    assert batch.error_file_id is None
