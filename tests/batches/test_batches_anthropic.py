"""Anthropic's Message Batches with the official anthropic SDK: ``messages.batches.create`` →
``retrieve`` until it has ended → ``results``, over Anthropic and OpenAI (translated), one of
them refusing a quarter of the requests; the usage recorded for the batch equals the upstreams'
books at the batch prices (1,000 requests, as the issue asks). Then list, cancel, delete,
refusals and other keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from batch_support import BATCH_MODELS, batch_usage_row, check_batch_usage, model_of, wait_until
from gateway_runner import GatewayThread, RunningGateway, make_settings
from native_gateway import KEY_ENV, native_fleet, native_policy
from native_upstreams import NativeFleet

REQUESTS = 1_000


@pytest.fixture(scope="module")
def upstreams() -> Iterator[NativeFleet]:
    with native_fleet() as fleet:
        yield fleet


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, upstreams: NativeFleet
) -> Iterator[RunningGateway]:
    root: Path = tmp_path_factory.mktemp("batches-anthropic")
    with pytest.MonkeyPatch.context() as env:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        policy = root / "routing_rules.yaml"
        policy.write_text(native_policy(upstreams, models=BATCH_MODELS))
        settings = make_settings(
            root / "data",
            policy,
            redis_url,
            batch_poll_interval_s=0.05,
            batch_concurrency=32,
            max_body_bytes=1024 * 1024,
        )
        with GatewayThread(settings) as running:
            yield running


def sdk(gateway: RunningGateway, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=gateway.base_url, max_retries=0)


def requests(count: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"req-{index}",
            "params": {
                "model": model_of(index),
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"question {index}"}],
            },
        }
        for index in range(count)
    ]


def ended(client: anthropic.Anthropic, batch_id: str, timeout_s: float = 60) -> Any:
    def done() -> Any:
        batch = client.messages.batches.retrieve(batch_id)
        return batch if batch.processing_status == "ended" else None

    return wait_until(done, timeout_s, f"message batch {batch_id} to end")


def test_message_batches_run_end_to_end_and_match_the_upstreams_books(
    gateway: RunningGateway, upstreams: NativeFleet
) -> None:
    upstreams.reset()
    _, key = gateway.create_key(name="message-batches")
    client = sdk(gateway, key)
    created = client.messages.batches.create(requests=requests(REQUESTS))  # type: ignore[arg-type]
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == REQUESTS

    batch = ended(client, created.id)
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.errored) == (
        0,
        REQUESTS * 3 // 4,
        REQUESTS // 4,
    )
    assert (counts.canceled, counts.expired) == (0, 0) and batch.ended_at is not None

    results = list(client.messages.batches.results(batch.id))
    assert len({result.custom_id for result in results}) == len(results) == REQUESTS
    for result in results:
        model = model_of(int(result.custom_id.split("-")[1]))
        if model == "gpt-b-filtered":
            assert result.result.type == "errored"
            assert result.result.error.error.type == "invalid_request_error"  # type: ignore[union-attr]
        else:
            assert result.result.type == "succeeded"
            message = result.result.message  # type: ignore[union-attr]
            assert message.content[0].text.endswith(result.custom_id.replace("req-", "question "))

    gpt = upstreams["openai"].books()["gpt-4o"]
    claude = upstreams["anthropic"].books()["claude-sonnet-4"]
    row = batch_usage_row(gateway, batch.id)
    check_batch_usage(row, REQUESTS, {"gpt-b": gpt, "claude-b": claude})

    listed = client.messages.batches.list(limit=10)
    assert batch.id in [item.id for item in listed.data]
    assert client.messages.batches.cancel(batch.id).processing_status == "ended"
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def test_a_bad_request_refuses_the_batch_in_anthropics_envelope(gateway: RunningGateway) -> None:
    _, key = gateway.create_key(name="refused")
    client = sdk(gateway, key)
    bad = requests(3)
    del bad[2]["params"]["max_tokens"]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.batches.create(requests=bad)  # type: ignore[arg-type]
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    assert "requests.2.params" in refused.value.message
    twice = requests(2)
    twice[1]["custom_id"] = twice[0]["custom_id"]
    with pytest.raises(anthropic.BadRequestError, match="earlier request"):
        client.messages.batches.create(requests=twice)  # type: ignore[arg-type]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(
            api_key="sk-sy-wrong", base_url=gateway.base_url, max_retries=0
        ).messages.batches.list()


def test_other_keys_cannot_see_a_batch_and_pages_follow_ids(gateway: RunningGateway) -> None:
    _, owner_key = gateway.create_key(name="owner")
    _, other_key = gateway.create_key(name="other")
    owner, other = sdk(gateway, owner_key), sdk(gateway, other_key)
    made = [owner.messages.batches.create(requests=requests(1)).id for _ in range(3)]  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):
        other.messages.batches.retrieve(made[0])
    assert other.messages.batches.list().data == []
    first = owner.messages.batches.list(limit=2)
    assert [item.id for item in first.data] == made[::-1][:2] and first.has_more
    rest = owner.messages.batches.list(limit=2, after_id=first.last_id)  # type: ignore[arg-type]
    assert [item.id for item in rest.data] == [made[0]] and not rest.has_more
    back = owner.messages.batches.list(limit=2, before_id=made[0])
    assert [item.id for item in back.data] == made[::-1][:2]
    assert [item.id for item in owner.messages.batches.list().data] == made[::-1]
    for batch_id in made:
        ended(owner, batch_id)
