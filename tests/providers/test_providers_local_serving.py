"""The openai SDK, through a real gateway, against the in-process engine on a tiny model."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from openai import OpenAI

from gateway.providers.fleet.scrape import parse_load

MESSAGES = [{"role": "user", "content": "How are you today?"}]


@pytest.fixture
def client(local_gateway, api_key) -> OpenAI:
    return OpenAI(base_url=local_gateway.v1, api_key=api_key, max_retries=0, timeout=60)


def test_chat_non_stream_is_openai_shaped_with_exact_usage(client, local_gateway, tokenizer):
    raw = client.chat.completions.with_raw_response.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    reply = raw.parse()
    assert raw.headers["x-switchyard-provider"] == "home"
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion"
    assert reply.model == "tiny-qwen3" and reply.created > 0
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True)
    assert reply.usage.prompt_tokens == len(prompt_ids)
    generated = choice.logprobs.content
    assert reply.usage.completion_tokens == len(generated) <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert all(len(item.top_logprobs) == 2 and item.logprob <= 0 for item in generated)
    if choice.finish_reason == "length":
        assert len(generated) == 12


def test_stream_matches_non_stream_with_role_first_and_usage(client, tokenizer):
    args = dict(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    whole = client.chat.completions.create(**args)
    chunks = list(
        client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    # No usage chunk when the client did not ask for one.
    plain = list(client.chat.completions.create(**args, stream=True))
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)


def test_n_two_choices_and_usage_sums_them(client, tokenizer):
    reply = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, n=2, temperature=1.0, seed=3, logprobs=True
    )
    assert [c.index for c in reply.choices] == [0, 1]
    counted = sum(len(c.logprobs.content) for c in reply.choices)
    assert reply.usage.completion_tokens == counted
    assert reply.usage.prompt_tokens == len(tokenizer.apply_chat_template(MESSAGES, tokenize=True))


def test_stop_string_cuts_the_text(client):
    args = dict(model="tiny", messages=MESSAGES, max_tokens=40, temperature=0)
    full = client.chat.completions.create(**args).choices[0].message.content
    assert len(full) >= 8, full
    stop = full[4:7]
    cut = client.chat.completions.create(**args, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.message.content == full[: full.index(stop)]


def test_seed_reproduces_sampling(client):
    args = dict(model="tiny", messages=MESSAGES, max_tokens=16, temperature=1.0)
    first = client.chat.completions.create(**args, seed=1234).choices[0].message.content
    again = client.chat.completions.create(**args, seed=1234).choices[0].message.content
    others = {
        client.chat.completions.create(**args, seed=s).choices[0].message.content for s in (1, 2, 3)
    }
    assert first == again
    assert len(others | {first}) > 1


def test_completions_endpoint_counts_with_the_tokenizer(client, tokenizer):
    prompt = "The quick brown fox"
    reply = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=5, temperature=0, logprobs=1
    )
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert reply.usage.completion_tokens == len(reply.choices[0].logprobs.tokens) == 5
    chunks = list(
        client.completions.create(
            model="tiny", prompt=prompt, max_tokens=5, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply.choices[0].text


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 100_000}, "messages"),
        ({"seed": "x"}, "seed"),
        ({"top_logprobs": 3}, "top_logprobs"),
        (
            {"tools": [{"type": "function", "function": {"name": "not a name!"}}]},
            "tools[0].function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"logit_bias": {"5": "high"}}, "logit_bias"),
        ({"store": True}, "store"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"extra_body": {"skip_special_tokens": False}}, "skip_special_tokens"),
        ({"extra_body": {"guided_json": 7}}, "guided_json"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"extra_body": {"no_such_field": 1}}, "no_such_field"),
    ],
)
def test_bad_values_are_400_naming_the_param(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, **extra)
    assert caught.value.body["param"] == param
    assert param in caught.value.message or param == "messages"


def test_fields_that_ask_for_nothing_are_accepted(client):
    reply = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=3,
        tool_choice="none",
        parallel_tool_calls=True,
        store=False,
        logit_bias={},
        service_tier="auto",
        modalities=["text"],
        user="end-user-7",
        metadata={"team_ref": "blue"},
        response_format={"type": "text"},
        extra_body={"skip_special_tokens": True},
    )
    assert reply.choices[0].message.role == "assistant"


def test_repetition_penalty_and_include_stop_str_in_output_are_honoured(client, checkpoint):
    """Both reach the engine: the gateway's greedy text equals a direct engine run's."""
    from engine.core.llm_engine import LLM
    from engine.sampling import SamplingParams

    llm = LLM(checkpoint, progress=False, device="cpu", kv_cache_bytes=16 << 20)
    prompt = llm.tokenizer.apply_chat_template(MESSAGES, tokenize=True)
    plain = SamplingParams(temperature=0.0, max_tokens=24)
    penalised = SamplingParams(temperature=0.0, max_tokens=24, repetition_penalty=1.8)
    expected = llm.generate([prompt], penalised)[0].text
    assert expected != llm.generate([prompt], plain)[0].text
    args = dict(model="tiny", messages=MESSAGES, max_tokens=24, temperature=0)
    reply = client.chat.completions.create(**args, extra_body={"repetition_penalty": 1.8})
    assert reply.choices[0].message.content == expected
    full = client.chat.completions.create(**args).choices[0].message.content
    stop = full[4:7]
    kept = client.chat.completions.create(
        **args, stop=[stop], extra_body={"include_stop_str_in_output": True}
    ).choices[0]
    assert kept.finish_reason == "stop"
    assert kept.message.content == full[: full.index(stop) + len(stop)]


def test_more_samples_than_engine_seats_is_a_400_naming_n(client):
    # the test engine has max_num_seqs 2: three samples could never run together
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, n=3, max_tokens=2)
    assert caught.value.body["param"] == "n" and "max_num_seqs (2)" in caught.value.message


def test_embeddings_on_a_local_model_is_a_clear_400(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="tiny", input="hello")
    assert "/v1/embeddings" in caught.value.message


def test_models_list_and_metrics(client, local_gateway):
    client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    ids = {m.id for m in client.models.list()}
    assert {"tiny", "up-model"} <= ids
    text = httpx.get(local_gateway.base_url + "/metrics", timeout=10).text
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_hits_total",
        "prefix_cache_queries_total",
        "num_preemptions_total",
        "time_to_first_token_seconds_count",
        "inter_token_latency_seconds_count",
        "e2e_request_latency_seconds_count",
    ):
        assert f"\n{name}" in text, name
    # Also under vLLM's names, so a fleet (or any vLLM-aware router) reads this engine; a
    # scraper reads one spelling, never the sum of both.
    for name in ("num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries_total"):
        assert f"\nvllm:{name} " in text, name
    queries = float(re.search(r"\nprefix_cache_queries_total (\S+)", text).group(1))
    assert queries > 0 and parse_load(text).prefix_queries == queries


def test_usage_events_and_rate_limits_as_for_upstreams(local_gateway):
    admin = {"Authorization": f"Bearer {local_gateway.admin_key}"}
    created = httpx.post(
        local_gateway.base_url + "/admin/keys", json={"name": "limited", "rpm": 2}, headers=admin
    ).json()
    client = OpenAI(base_url=local_gateway.v1, api_key=created["key"], max_retries=0)
    replies = [
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
        for _ in range(2)
    ]
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    local_gateway.wait_exported()
    events = httpx.get(
        local_gateway.base_url + "/admin/usage/events",
        params={"key": created["id"]},
        headers=admin,
        timeout=10,
    ).json()["data"]
    served = [e for e in events if e["status"] == 200]
    assert len(served) == 2
    for event in served:
        assert event["model"] == "tiny" and event["provider"] == "home"
        assert event["cost_usd"] == 0
    assert sorted(e["prompt_tokens"] + e["completion_tokens"] for e in served) == sorted(
        r.usage.total_tokens for r in replies
    )
