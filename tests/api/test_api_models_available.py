"""``GET /v1/models`` says which models can be served here now: ``available``, and for the
others the reason (a provider key not set) and the fallback that would answer a request
pinned to it; ``?available=true`` lists only the servable ones. The openai SDK as client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from gateway_runner import GatewayThread, RunningGateway, make_settings
from native_anthropic import FakeAnthropic
from native_gateway import OPENAI_KEY
from native_openai import FakeOpenAI
from native_upstreams import NativeFleet

MISSING = "SY_TEST_UNSET_ANTHROPIC_KEY"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[RunningGateway]:
    root: Path = tmp_path_factory.mktemp("models")
    fleet = NativeFleet(FakeOpenAI("openai", OPENAI_KEY), FakeAnthropic("anthropic", "sk-ant-x"))
    with pytest.MonkeyPatch.context() as env, fleet:
        env.setenv("SY_TEST_OPENAI_KEY", OPENAI_KEY)
        env.delenv(MISSING, raising=False)
        policy = root / "routing_rules.yaml"
        policy.write_text(f"""
providers:
  openai: {{base_url: "{fleet["openai"].url}", api_key_env: SY_TEST_OPENAI_KEY}}
  anthropic: {{kind: anthropic, base_url: "{fleet["anthropic"].url}", api_key_env: {MISSING}}}
models:
  gpt: {{provider: openai}}
  claude: {{provider: anthropic}}
  orphan: {{provider: anthropic}}
aliases:
  smart: claude
  fast: gpt
fallbacks:
  claude: [gpt]
""")
        with GatewayThread(make_settings(root / "data", policy, redis_url)) as running:
            yield running


def client(gateway: RunningGateway, **key: object) -> openai.OpenAI:
    api_key = gateway.create_key(name="models", **key)[1]
    return openai.OpenAI(base_url=gateway.v1, api_key=api_key, max_retries=0)


def test_each_entry_says_whether_it_can_be_served(gateway) -> None:
    entries = {m.id: m.model_extra for m in client(gateway).models.list().data}
    assert entries["gpt"] == {"available": True}
    assert entries["fast"] == {"available": True}
    reason = f"{MISSING} is not set"
    claude = {"available": False, "unavailable_reason": reason, "answered_by": "gpt"}
    assert entries["claude"] == entries["smart"] == claude
    assert entries["orphan"] == {"available": False, "unavailable_reason": reason}


def test_available_true_lists_only_the_servable(gateway) -> None:
    oai = client(gateway)
    servable = oai.models.list(extra_query={"available": "true"})
    assert sorted(m.id for m in servable.data) == ["fast", "gpt"]
    unservable = oai.models.list(extra_query={"available": "false"})
    assert sorted(m.id for m in unservable.data) == ["claude", "orphan", "smart"]
    with pytest.raises(openai.BadRequestError) as refused:
        oai.models.list(extra_query={"available": "yes"})
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "available"


def test_what_the_list_says_is_what_a_request_gets(gateway) -> None:
    oai = client(gateway)
    one = oai.models.retrieve("orphan")
    assert one.model_extra["available"] is False
    with pytest.raises(openai.APIStatusError) as refused:
        oai.chat.completions.create(model="orphan", messages=[{"role": "user", "content": "Hi"}])
    assert refused.value.status_code == 503
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "upstream_not_configured"
    answered = oai.chat.completions.with_raw_response.create(
        model="claude", messages=[{"role": "user", "content": "Hi"}]
    )
    assert answered.headers["x-switchyard-model"] == "gpt"  # the list's answered_by


def test_a_fallback_the_key_may_not_use_is_not_offered(gateway) -> None:
    entries = {m.id: m.model_extra for m in client(gateway, models=["claude"]).models.list().data}
    assert set(entries) == {"claude", "smart"}
    assert "answered_by" not in entries["claude"] and entries["claude"]["available"] is False
