"""A provider's ``headers`` in the policy may be credentials: a value can come from an
environment variable (``{value_env: NAME}``), and ``GET /admin/policy`` shows header values
only to the admin role. A real gateway in front of a loopback OpenAI upstream that records what
it is sent; the operator is a named admin token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from native_openai import FakeOpenAI
from native_upstreams import NativeFleet

from gateway.policy import PolicyError, validate_policy_data

UPSTREAM_KEY = "sk-openai-upstream-0123456789"
LITERAL = "literal-org-secret-4f1c9a"
FROM_ENV = "env-partner-token-8d2e7b"
ENV = {"SY_TEST_HDR_UPSTREAM_KEY": UPSTREAM_KEY, "SY_TEST_HDR_TOKEN": FROM_ENV}

POLICY = """
providers:
  partner:
    base_url: {url}
    api_key_env: SY_TEST_HDR_UPSTREAM_KEY
    headers:
      X-Partner-Org: {literal}
      X-Partner-Token: {{value_env: SY_TEST_HDR_TOKEN}}
  unset:
    base_url: {url}
    api_key_env: SY_TEST_HDR_UPSTREAM_KEY
    headers:
      X-Partner-Token: {{value_env: SY_TEST_HDR_NOT_SET}}
models:
  partner-model:
    provider: partner
    upstream_model: gpt-4o-mini
  unset-model:
    provider: unset
    upstream_model: gpt-4o-mini
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeOpenAI]:
    with NativeFleet(FakeOpenAI("openai", UPSTREAM_KEY)) as fleet:
        yield fleet["openai"]


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, upstream: FakeOpenAI, redis_url: str
) -> Iterator[RunningGateway]:
    directory: Path = tmp_path_factory.mktemp("policy-headers")
    policy = directory / "routing_rules.yaml"
    policy.write_text(POLICY.format(url=upstream.url, literal=LITERAL))
    with pytest.MonkeyPatch.context() as env:
        for name, value in ENV.items():
            env.setenv(name, value)
        env.delenv("SY_TEST_HDR_NOT_SET", raising=False)
        with GatewayThread(make_settings(directory / "data", policy, redis_url)) as running:
            yield running


@pytest.fixture(scope="module")
def literal_gateway(
    tmp_path_factory: pytest.TempPathFactory, upstream: FakeOpenAI, redis_url: str
) -> Iterator[RunningGateway]:
    """A policy of literal header values only (what every gateway so far could load)."""
    directory: Path = tmp_path_factory.mktemp("literal-headers")
    policy = directory / "routing_rules.yaml"
    policy.write_text(
        f"""
providers:
  partner:
    base_url: {upstream.url}
    headers: {{X-Partner-Org: {LITERAL}}}
models:
  partner-model: {{provider: partner}}
"""
    )
    with GatewayThread(make_settings(directory / "data", policy, redis_url)) as running:
        yield running


def _operator(gateway: RunningGateway) -> str:
    with gateway.admin() as admin:
        made = admin.post("/admin/tokens", json={"name": "policy-reader", "role": "operator"})
    assert made.status_code == 201, made.text
    return made.json()["token"]


def test_header_values_from_the_environment_reach_the_provider(
    gateway: RunningGateway, upstream: FakeOpenAI
) -> None:
    _, key = gateway.create_key(name="headers")
    answer = httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": "partner-model", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    sent = [seen for seen in upstream.seen if seen.path == "/v1/chat/completions"][-1].headers
    assert sent["x-partner-org"] == LITERAL
    assert sent["x-partner-token"] == FROM_ENV


def test_an_unset_header_variable_makes_the_provider_unusable_saying_which(
    gateway: RunningGateway,
) -> None:
    _, key = gateway.create_key(name="unset-header")
    answer = httpx.post(
        gateway.v1 + "/chat/completions",
        json={"model": "unset-model", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"] == "upstream_not_configured"
    assert "SY_TEST_HDR_NOT_SET" in error["message"]
    with gateway.admin() as admin:
        explained = admin.post("/admin/route/explain", json={"body": {"model": "unset-model"}})
    verdicts = [row["verdict"] for row in explained.json()["health"]]
    assert verdicts == ["skipped: missing header value (SY_TEST_HDR_NOT_SET is not set)"]


def test_an_operator_sees_header_names_and_variables_never_values(
    gateway: RunningGateway,
) -> None:
    operator = _operator(gateway)
    shown = httpx.get(
        gateway.base_url + "/admin/policy",
        headers={"Authorization": f"Bearer {operator}"},
        timeout=30,
    )
    assert shown.status_code == 200
    assert LITERAL not in shown.text and FROM_ENV not in shown.text
    headers = shown.json()["policy"]["providers"]["partner"]["headers"]
    assert headers == {
        "X-Partner-Org": "[hidden]",
        "X-Partner-Token": {"value_env": "SY_TEST_HDR_TOKEN"},
    }
    # The admin, who may replace the policy, reads it as written (never the env value).
    with gateway.admin() as admin:
        full = admin.get("/admin/policy")
    assert full.json()["policy"]["providers"]["partner"]["headers"] == {
        "X-Partner-Org": LITERAL,
        "X-Partner-Token": {"value_env": "SY_TEST_HDR_TOKEN"},
    }
    assert FROM_ENV not in full.text


def test_an_operator_never_reads_a_literal_header_value(literal_gateway: RunningGateway) -> None:
    operator = _operator(literal_gateway)
    shown = httpx.get(
        literal_gateway.base_url + "/admin/policy",
        headers={"Authorization": f"Bearer {operator}"},
        timeout=30,
    )
    assert shown.status_code == 200 and shown.json()["policy"] is not None
    assert LITERAL not in shown.text
    assert shown.json()["policy"]["providers"]["partner"]["headers"] == {
        "X-Partner-Org": "[hidden]"
    }


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"value_env": "NOT-A-NAME"}, "providers.p.headers.X-Token"),
        ({"value_env": "9STARTS_WITH_A_DIGIT"}, "providers.p.headers.X-Token"),
        ({"value": "x"}, "providers.p.headers.X-Token"),
        (5, "providers.p.headers.X-Token"),
    ],
)
def test_a_header_value_is_text_or_a_variable_name(value: object, path: str) -> None:
    with pytest.raises(PolicyError) as caught:
        validate_policy_data(
            {"providers": {"p": {"base_url": "http://x", "headers": {"X-Token": value}}}}
        )
    assert caught.value.path.startswith(path), caught.value.path
