"""``batch: native``: batch lines routed to an OpenAI or Anthropic provider in its own format go
to the provider's own batch API (its Files and Batch API, its Message Batches), polled and
mapped back, beside lines the pipeline runs (other providers, cross-format routes), with the
official SDKs end to end against loopback providers that check their own credentials.

Every line is answered once; the usage recorded for a batch equals the providers' books at the
batch price, to the token and the nano-dollar; a cancel cancels the upstream batch; an upstream
batch is submitted once, also when its creation's answer was lost or the gateway restarted;
native lines hold the key's budget but take none of its RPM, and a spent budget answers them
with the pipeline's 429.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import redis.asyncio
from batch_support import (
    BATCH_MODELS,
    batch_cost_nanos,
    batch_usage_row,
    chat_jsonl,
    check_batch_usage,
    check_chat_lines,
    jsonl,
    model_of,
    wait_until,
)
from gateway_runner import GatewayThread, RunningGateway, make_settings
from native_gateway import KEY_ENV, native_fleet, native_policy
from native_upstreams import NativeFleet

from gateway.batches.store import make_batch_store
from gateway.metering.limits import KeyLimits, Limiter
from gateway.money import usd_to_nanos
from gateway.policy import PolicyError, parse_policy

LINES = 120
FINAL = ("completed", "failed", "expired", "cancelled")
# An Anthropic model whose upstream refuses every request (the prompt is too long).
NATIVE_MODELS = (
    BATCH_MODELS
    + """
  claude-b-overflow:
    provider: anthropic
    upstream_model: claude-ctx-overflow
    price: {input: 3, output: 15}
"""
)


@pytest.fixture(scope="module")
def upstreams() -> Iterator[NativeFleet]:
    with native_fleet() as fleet:
        yield fleet


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory, upstreams: NativeFleet) -> Path:
    path = tmp_path_factory.mktemp("native-policy") / "routing_rules.yaml"
    path.write_text(
        native_policy(upstreams, models=NATIVE_MODELS, native_batches=("openai", "anthropic"))
    )
    return path


def native_settings(data_dir: Path, policy: Path, redis_url: str, **more: Any) -> Any:
    return make_settings(
        data_dir,
        policy,
        redis_url,
        batch_poll_interval_s=0.05,
        batch_native_poll_s=0.05,
        batch_concurrency=32,
        **more,
    )


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, policy_file: Path
) -> Iterator[RunningGateway]:
    root = tmp_path_factory.mktemp("batches-native")
    with pytest.MonkeyPatch.context() as env:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        with GatewayThread(native_settings(root / "data", policy_file, redis_url)) as running:
            yield running


@pytest.fixture
def fresh(upstreams: NativeFleet) -> NativeFleet:
    upstreams.reset()
    return upstreams


def sdk(gateway: RunningGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=gateway.v1, max_retries=0)


def run_batch(client: openai.OpenAI, data: bytes) -> Any:
    uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


def finished(client: openai.OpenAI, batch_id: str, timeout_s: float = 60) -> Any:
    def ended() -> Any:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in FINAL else None

    return wait_until(ended, timeout_s, f"batch {batch_id} to end")


def test_batch_native_on_another_kind_is_a_policy_error_naming_the_field(
    upstreams: NativeFleet,
) -> None:
    for name, kind in (("azure", "azure_openai"), ("fleet", "engine_fleet")):
        with pytest.raises(PolicyError) as refused:
            parse_policy(native_policy(upstreams, native_batches=(name,)))
        assert refused.value.path == f"providers.{name}.batch"
        assert f"(this one is {kind})" in refused.value.message


def test_openai_lines_go_to_openais_batch_api_beside_the_pipelines_lines(
    gateway: RunningGateway, fresh: NativeFleet
) -> None:
    """A mixed batch: gpt-b and gpt-b-filtered lines land on the native OpenAI provider in its
    own format (one upstream batch); claude-b lines are a cross-format route (to Anthropic,
    translated), which the pipeline runs."""
    _, key = gateway.create_key(name="native-openai")
    client = sdk(gateway, key)
    batch = finished(client, run_batch(client, chat_jsonl(LINES)).id)
    assert batch.status == "completed"
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (LINES, LINES * 3 // 4, LINES // 4)

    openai_up, anthropic_up = fresh["openai"], fresh["anthropic"]
    assert openai_up.batches.submissions == 1 and anthropic_up.batches.submissions == 0
    (upstream,) = openai_up.batches.batches.values()
    native = [f"line-{i}" for i in range(LINES) if model_of(i).startswith("gpt-b")]
    assert [custom_id for custom_id, _ in upstream.requests] == native
    sent_models = {item["body"]["model"] for _, item in upstream.requests}
    assert sent_models == {"gpt-4o", "gpt-4o-filtered"}  # the upstream models' names
    through_pipeline = [s for s in anthropic_up.seen if s.path == "/v1/messages"]
    assert len(through_pipeline) == LINES // 2

    output = jsonl(client.files.content(batch.output_file_id).text)
    errors = jsonl(client.files.content(batch.error_file_id).text)
    check_chat_lines(output, errors, LINES)

    gpt = openai_up.books()["gpt-4o"]
    claude = anthropic_up.books()["claude-sonnet-4"]
    assert gpt["requests"] == LINES // 4 and claude["requests"] == LINES // 2
    check_batch_usage(batch_usage_row(gateway, batch.id), LINES, {"gpt-b": gpt, "claude-b": claude})


def test_anthropic_requests_go_to_message_batches_beside_the_pipelines(
    gateway: RunningGateway, fresh: NativeFleet
) -> None:
    _, key = gateway.create_key(name="native-anthropic")
    client = anthropic.Anthropic(api_key=key, base_url=gateway.base_url, max_retries=0)
    models = ("claude-b", "claude-b-overflow", "gpt-b", "claude-b")
    requests = [
        {
            "custom_id": f"req-{index}",
            "params": {
                "model": models[index % 4],
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"question {index}"}],
            },
        }
        for index in range(LINES)
    ]
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]

    def ended() -> Any:
        batch = client.messages.batches.retrieve(created.id)
        return batch if batch.processing_status == "ended" else None

    batch = wait_until(ended, 60, "the message batch to end")
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.canceled) == (LINES * 3 // 4, LINES // 4, 0)
    assert fresh["anthropic"].batches.submissions == 1
    assert fresh["openai"].batches.submissions == 0  # gpt-b is a cross-format route
    (upstream,) = fresh["anthropic"].batches.batches.values()
    assert len(upstream.requests) == LINES * 3 // 4
    assert {params["model"] for _, params in upstream.requests} == {
        "claude-sonnet-4",
        "claude-ctx-overflow",
    }

    results = list(client.messages.batches.results(batch.id))
    assert len({result.custom_id for result in results}) == len(results) == LINES
    for result in results:
        index = int(result.custom_id.split("-")[1])
        if models[index % 4] == "claude-b-overflow":
            assert result.result.type == "errored"
            error = result.result.error.error  # type: ignore[union-attr]
            assert error.type == "invalid_request_error" and "too long" in error.message
        else:
            assert result.result.type == "succeeded"
            text = result.result.message.content[0].text  # type: ignore[union-attr]
            assert text.endswith(f"question {index}")

    claude = fresh["anthropic"].books()["claude-sonnet-4"]
    gpt = fresh["openai"].books()["gpt-4o"]
    check_batch_usage(batch_usage_row(gateway, batch.id), LINES, {"gpt-b": gpt, "claude-b": claude})


def test_a_cancel_cancels_the_upstream_batch_and_keeps_what_it_answered(
    gateway: RunningGateway, fresh: NativeFleet
) -> None:
    upstream = fresh["openai"]
    upstream.batches.hold = True  # it runs until cancelled
    _, key = gateway.create_key(name="native-cancel")
    client = sdk(gateway, key)
    created = run_batch(client, chat_jsonl(40, model=lambda _: "gpt-b"))
    wait_until(lambda: upstream.batches.polls >= 2, 30, "the upstream batch to be polled")
    client.batches.cancel(created.id)
    batch = finished(client, created.id)
    assert batch.status == "cancelled"
    assert (upstream.batches.submissions, upstream.batches.cancels) == (1, 1)
    output = jsonl(client.files.content(batch.output_file_id).text)
    errors = jsonl(client.files.content(batch.error_file_id).text)
    assert [line["custom_id"] for line in output] == [f"line-{i}" for i in range(20)]
    assert [line["custom_id"] for line in errors] == [f"line-{i}" for i in range(20, 40)]
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert batch.request_counts.completed == 20 and batch.request_counts.total == 40
    row = batch_usage_row(gateway, batch.id)
    assert row["requests"] == 20  # what the provider ran before the cancel
    assert row["cost_nanos"] == batch_cost_nanos("gpt-b", upstream.books()["gpt-4o"])


def test_an_upstream_expiry_and_the_gateways_own_window_end_close_lines_expired(
    gateway: RunningGateway, fresh: NativeFleet
) -> None:
    upstream = fresh["openai"]
    upstream.batches.hold = True
    _, key = gateway.create_key(name="native-expiry")
    client = sdk(gateway, key)

    # The provider's own window passes: none of its requests ran.
    first = run_batch(client, chat_jsonl(6, model=lambda _: "gpt-b"))
    wait_until(lambda: upstream.batches.polls >= 2, 30, "the upstream batch polled")
    (made,) = upstream.batches.batches
    upstream.batches.expire(made)
    batch = finished(client, first.id)
    assert batch.status == "completed" and batch.output_file_id is None
    errors = jsonl(client.files.content(batch.error_file_id).text)
    assert len(errors) == 6 and {line["error"]["code"] for line in errors} == {"batch_expired"}

    # The gateway's window ends first: it cancels upstream, keeps what ran, expires the rest.
    second = run_batch(client, chat_jsonl(10, model=lambda _: "gpt-b"))
    wait_until(lambda: upstream.batches.submissions == 2, 30, "the second upstream batch")

    async def end_the_window() -> None:  # as if 24 hours had passed
        store = make_batch_store("", data_dir=gateway.settings.data_dir)
        await store.open()
        try:
            await store.expire_at(second.id, int(time.time() * 1000))
        finally:
            await store.close()

    asyncio.run(end_the_window())
    batch = finished(client, second.id)
    assert batch.status == "expired" and upstream.batches.cancels == 1
    output = jsonl(client.files.content(batch.output_file_id).text)
    errors = jsonl(client.files.content(batch.error_file_id).text)
    assert [line["custom_id"] for line in output] == [f"line-{i}" for i in range(5)]
    assert {line["error"]["code"] for line in errors} == {"batch_expired"} and len(errors) == 5


def test_a_creation_whose_answer_was_lost_is_found_again_not_submitted_twice(
    gateway: RunningGateway, fresh: NativeFleet
) -> None:
    upstream = fresh["openai"]
    upstream.lose_create_answers = 1  # made upstream, answered 500
    _, key = gateway.create_key(name="native-lost")
    client = sdk(gateway, key)
    batch = finished(client, run_batch(client, chat_jsonl(8, model=lambda _: "gpt-b")).id)
    assert batch.status == "completed" and batch.request_counts.completed == 8
    assert upstream.batches.submissions == 1  # found by its metadata, not made again
    (made,) = upstream.batches.batches.values()
    assert set(made.metadata) == {"switchyard_native_id"}
    assert '"batch_native_found"' in gateway.log.getvalue()
    output = jsonl(client.files.content(batch.output_file_id).text)
    assert sorted(line["custom_id"] for line in output) == [f"line-{i}" for i in range(8)]


def test_a_provider_without_a_batch_api_has_its_lines_run_by_the_pipeline(
    gateway: RunningGateway, fresh: NativeFleet
) -> None:
    upstream = fresh["openai"]
    upstream.without_batch_api = True
    _, key = gateway.create_key(name="native-refused")
    client = sdk(gateway, key)
    batch = finished(client, run_batch(client, chat_jsonl(8, model=lambda _: "gpt-b")).id)
    assert batch.status == "completed" and batch.request_counts.completed == 8
    assert upstream.batches.submissions == 0 and '"batch_native_refused"' in gateway.log.getvalue()
    assert upstream.books()["gpt-4o"]["requests"] == 8  # each through the pipeline
    row = batch_usage_row(gateway, batch.id)
    assert row["requests"] == 8
    assert row["cost_nanos"] == batch_cost_nanos("gpt-b", upstream.books()["gpt-4o"])


async def key_status(redis_url: str, key_id: str, limits: KeyLimits) -> dict[str, Any]:
    client = redis.asyncio.from_url(redis_url)
    try:
        return await Limiter(client).status(key_id, limits)
    finally:
        await client.aclose()


def test_native_lines_hold_the_budget_but_take_no_rpm_and_a_spent_budget_refuses_them(
    gateway: RunningGateway, fresh: NativeFleet, redis_url: str
) -> None:
    # An RPM of 2 would let the pipeline run one line a minute (half of it for batches).
    key_id, key = gateway.create_key(name="native-budget", rpm=2, budget_usd=1.0)
    client = sdk(gateway, key)
    batch = finished(client, run_batch(client, chat_jsonl(30, model=lambda _: "gpt-b")).id)
    assert batch.status == "completed" and batch.request_counts.completed == 30
    limits = KeyLimits(rpm=2, budget_nanos=usd_to_nanos(1.0))
    status = asyncio.run(key_status(redis_url, key_id, limits))
    books = fresh["openai"].books()["gpt-4o"]
    assert status["requests"]["used"] == 0 and status["tokens"]["used"] == 0
    assert status["budget"]["spent_nanos"] == batch_cost_nanos("gpt-b", books) > 0
    assert status["budget"]["reserved_nanos"] == 0  # every hold settled

    # A budget smaller than one line's worst case: no line goes upstream, each is refused.
    _, poor = gateway.create_key(name="native-poor", budget_usd=0.0001, budget_period="total")
    poor_client = sdk(gateway, poor)
    refused = finished(
        poor_client, run_batch(poor_client, chat_jsonl(4, model=lambda _: "gpt-b")).id
    )
    assert refused.status == "completed" and refused.request_counts.failed == 4
    assert fresh["openai"].batches.submissions == 1  # the first batch's only
    for line in jsonl(poor_client.files.content(refused.error_file_id).text):
        assert line["response"]["status_code"] == 429
        assert line["response"]["body"]["error"]["code"] == "insufficient_quota"


def test_a_restarted_gateway_resumes_polling_the_upstream_batch_without_submitting_again(
    tmp_path: Path, redis_url: str, policy_file: Path, fresh: NativeFleet
) -> None:
    upstream = fresh["openai"]
    upstream.batches.hold = True
    settings = native_settings(tmp_path / "data", policy_file, redis_url, batch_lease_s=1.0)
    with pytest.MonkeyPatch.context() as env:
        for name, value in KEY_ENV.items():
            env.setenv(name, value)
        with GatewayThread(settings) as first:
            _, key = first.create_key(name="native-restart")
            created = run_batch(sdk(first, key), chat_jsonl(10, model=lambda _: "gpt-b"))
            wait_until(lambda: upstream.batches.polls >= 2, 30, "the upstream batch polled")
        upstream.batches.hold = False  # it ends while no gateway runs
        with GatewayThread(settings) as second:
            client = sdk(second, key)
            batch = finished(client, created.id)
            assert '"batch_native_submitted"' not in second.log.getvalue()
            output = jsonl(client.files.content(batch.output_file_id).text)
    assert batch.status == "completed" and batch.request_counts.completed == 10
    assert upstream.batches.submissions == 1
    assert sorted(line["custom_id"] for line in output) == sorted(f"line-{i}" for i in range(10))
