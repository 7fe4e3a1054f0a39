"""The response cache end to end: ``switchyard serve`` (a process, its embedded Redis) in front
of a loopback OpenAI upstream that counts what reaches it, clients on the openai SDK (and
httpx where the stream's exact bytes are compared)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from fake_provider import FakeProvider, FakeProviderFleet
from gateway_runner import GatewayProcess
from polling import wait_for

POLICY = """
providers:
  alpha:
    base_url: {base_url}
    forward_headers: [anthropic-beta, OpenAI-Organization]
models:
  cached:
    provider: alpha
    upstream_model: up-cached
    price: {{input: 1000, output: 2000}}
    cache: {{ttl_s: 60, max_entry_bytes: 100000}}
  shared:
    provider: alpha
    cache: {{shared: true}}
  tiny:
    provider: alpha
    cache: {{max_entry_bytes: 200}}
  loose:
    provider: alpha
    cache: {{allow_nondeterministic: true}}
  plain:
    provider: alpha
"""
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeProvider]:
    with FakeProviderFleet("alpha") as fleet:
        yield fleet["alpha"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, upstream: FakeProvider) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("cache-serve")
    policy = root / "routing_rules.yaml"
    policy.write_text(POLICY.format(base_url=upstream.base_url))
    with GatewayProcess(root / "data", policy) as gateway:
        yield gateway


@pytest.fixture(autouse=True)
def fresh(served: Any, upstream: FakeProvider) -> None:
    with served.admin() as admin:
        assert admin.delete("/admin/cache", params={"all": "true"}).status_code == 200
    upstream.clear_hits()


def sdk(served: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url + "/v1", api_key=key, max_retries=0)


def ask(client: openai.OpenAI, model: str = "cached", **options: Any) -> Any:
    """A raw response (headers and body) of one chat completion, temperature 0 by default."""
    options.setdefault("temperature", 0)
    return client.chat.completions.with_raw_response.create(
        model=model, messages=QUESTION, **options
    )


def stored(served: Any, count: int, **filters: str) -> dict[str, Any]:
    """The cache's stats once ``count`` answers were stored (stores follow the answer)."""

    def check() -> dict[str, Any] | None:
        with served.admin() as admin:
            stats = admin.get("/admin/cache", params=filters).json()
        return stats if stats["store"] >= count else None

    return wait_for(check, timeout_s=10)


def events(served: Any, key_id: str) -> list[dict[str, Any]]:
    with served.admin() as admin:
        return admin.get("/admin/usage/events", params={"key": key_id}).json()["data"]


def test_second_identical_request_is_a_hit_and_upstream_sees_one(
    served: Any, upstream: FakeProvider
) -> None:
    key_id, key = served.create_key(name="hit", team="search")
    client = sdk(served, key)
    first = ask(client)
    assert first.headers["x-switchyard-cache"] == "miss"
    stored(served, 1)
    second = ask(client, temperature=0.0, user="someone-else")  # same answer, same entry
    assert second.headers["x-switchyard-cache"] == "hit"
    assert second.content == first.content
    assert second.headers["x-switchyard-model"] == "cached"
    assert second.headers["x-switchyard-route"].endswith("reason=cache")
    assert int(second.headers["age"]) >= 0
    assert second.parse().choices[0].message.content == "served by alpha"
    assert upstream.hit_count() == 1
    # The hit is booked: usage from the cache, the stored tokens, no cost.
    booked = wait_for(lambda: len(events(served, key_id)) == 2 and events(served, key_id))
    hit, miss = booked  # newest first
    assert miss["usage_source"] == "provider" and miss["cost_nanos"] > 0
    assert hit["usage_source"] == "cache" and hit["cost_nanos"] == 0
    assert (hit["prompt_tokens"], hit["completion_tokens"]) == (10, 5)
    assert hit["cached_tokens"] == 10
    stats = stored(served, 1, model="cached", team="search")
    assert (stats["hit"], stats["miss"], stats["entries"]) == (1, 1, 1)


def test_a_streamed_hit_replays_the_same_bytes(served: Any, upstream: FakeProvider) -> None:
    _, key = served.create_key(name="stream", team="search")
    body = {"model": "cached", "messages": QUESTION, "temperature": 0, "stream": True}
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=served.base_url, headers=headers, timeout=30) as http:
        first = http.post("/v1/chat/completions", json=body)
        assert first.headers["x-switchyard-cache"] == "miss"
        assert first.content.endswith(b"data: [DONE]\n\n")
        stored(served, 1)
        second = http.post("/v1/chat/completions", json=body)
        assert second.headers["x-switchyard-cache"] == "hit"
        assert second.headers["content-type"].startswith("text/event-stream")
        assert second.content == first.content
        assert b'"usage"' not in second.content  # the client did not ask for it
        # A client that asks for usage gets the usage chunk the first client did not see.
        with_usage = {**body, "stream_options": {"include_usage": True}}
        third = http.post("/v1/chat/completions", json=with_usage)
        assert third.headers["x-switchyard-cache"] == "hit"
        assert third.content.startswith(first.content[: -len(b"data: [DONE]\n\n")])
        assert b'"prompt_tokens":10' in third.content
    assert upstream.hit_count() == 1
    # The openai SDK reads the replay as a stream like any other.
    chunks = sdk(served, key).chat.completions.create(
        model="cached", messages=QUESTION, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "served by alpha"
    assert upstream.hit_count() == 1


def test_two_teams_never_share_an_entry(served: Any, upstream: FakeProvider) -> None:
    _, search = served.create_key(name="a", team="search")
    _, support = served.create_key(name="b", team="support")
    _, loner = served.create_key(name="c")  # no team: a scope of its own
    assert ask(sdk(served, search)).headers["x-switchyard-cache"] == "miss"
    stored(served, 1)
    assert ask(sdk(served, support)).headers["x-switchyard-cache"] == "miss"
    assert ask(sdk(served, loner)).headers["x-switchyard-cache"] == "miss"
    assert upstream.hit_count() == 3
    # ... unless the policy shares the model's cache.
    assert ask(sdk(served, search), "shared").headers["x-switchyard-cache"] == "miss"
    stored(served, 4)
    assert ask(sdk(served, support), "shared").headers["x-switchyard-cache"] == "hit"
    assert upstream.hit_count() == 4


def test_requests_that_differ_in_a_forwarded_header_never_share_an_entry(
    served: Any, upstream: FakeProvider
) -> None:
    _, key = served.create_key(name="forwarded", team="search")
    client = sdk(served, key)
    assert ask(client).headers["x-switchyard-cache"] == "miss"
    stored(served, 1)
    beta = {"anthropic-beta": "context-1m"}
    assert ask(client, extra_headers=beta).headers["x-switchyard-cache"] == "miss"
    stored(served, 2)
    assert ask(client, extra_headers=beta).headers["x-switchyard-cache"] == "hit"
    organization = {"OpenAI-Organization": "org-other"}
    assert ask(client, extra_headers=organization).headers["x-switchyard-cache"] == "miss"
    # A header the provider does not forward cannot change the answer: the first entry.
    unforwarded = {"x-unrelated": "1", "x-request-id": "req-other"}
    assert ask(client, extra_headers=unforwarded).headers["x-switchyard-cache"] == "hit"
    assert upstream.hit_count() == 3


def test_bypass_goes_upstream(served: Any, upstream: FakeProvider) -> None:
    _, key = served.create_key(name="bypass", team="search")
    client = sdk(served, key)
    ask(client)
    stored(served, 1)
    for headers in ({"Cache-Control": "no-cache"}, {"x-switchyard-cache": "bypass"}):
        answer = ask(client, extra_headers=headers)
        assert answer.headers["x-switchyard-cache"] == "bypass"
    assert upstream.hit_count() == 3
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, extra_headers={"x-switchyard-cache": "please"})
    assert refused.value.body["param"] == "x-switchyard-cache"
    assert upstream.hit_count() == 3


def test_only_deterministic_requests_and_configured_models_are_cached(
    served: Any, upstream: FakeProvider
) -> None:
    _, key = served.create_key(name="det", team="search")
    client = sdk(served, key)
    unset = openai.NOT_GIVEN
    for options in ({"temperature": 0.7}, {"n": 2, "seed": 1}, {"temperature": unset}):
        assert ask(client, **options).headers["x-switchyard-cache"] == "bypass"
    assert ask(client, seed=7, temperature=1).headers["x-switchyard-cache"] == "miss"
    assert ask(client, "plain").headers["x-switchyard-cache"] == "bypass"
    assert ask(client, "loose", temperature=1).headers["x-switchyard-cache"] == "miss"
    stats = stored(served, 2)
    assert stats["skip_nondeterministic"] >= 2


def test_max_entry_bytes_and_purge(served: Any, upstream: FakeProvider) -> None:
    _, key = served.create_key(name="size", team="search")
    client = sdk(served, key)
    assert ask(client, "tiny").headers["x-switchyard-cache"] == "miss"
    assert ask(client, "cached").headers["x-switchyard-cache"] == "miss"
    stats = stored(served, 1)
    assert ask(client, "tiny").headers["x-switchyard-cache"] == "miss"  # too large to keep
    with served.admin() as admin:
        tiny = admin.get("/admin/cache", params={"model": "tiny"}).json()
        assert tiny["skip_too_large"] == 2 and tiny["entries"] == 0
        assert stats["entries"] == 1
        purged = admin.delete("/admin/cache", params={"team": "search"}).json()["purged"]
        assert purged["entries"] == 1
        assert admin.delete("/admin/cache").status_code == 400  # no filter, no all=true
    assert ask(client, "cached").headers["x-switchyard-cache"] == "miss"
    assert upstream.hit_count() == 4


def test_a_hit_counts_against_rpm(served: Any, upstream: FakeProvider) -> None:
    _, key = served.create_key(name="rpm", team="limited", rpm=2)
    client = sdk(served, key)
    ask(client)
    stored(served, 1, team="limited")
    assert ask(client).headers["x-switchyard-cache"] == "hit"
    with pytest.raises(openai.RateLimitError) as limited:
        ask(client)
    assert limited.value.response.headers["x-switchyard-cache"] == "bypass"
    assert upstream.hit_count() == 1


def test_policy_names_a_bad_cache_field() -> None:
    from gateway.policy import PolicyError, parse_policy

    text = POLICY.format(base_url="http://127.0.0.1:1/v1").replace("ttl_s: 60", "ttl_s: 0")
    with pytest.raises(PolicyError) as refused:
        parse_policy(text)
    assert refused.value.path == "models.cached.cache.ttl_s"
