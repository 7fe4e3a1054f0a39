"""``switchyard policy prices``: the price each model is costed at and its source, for a policy
file (no gateway needed) or the policy in force (through the admin API)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import orjson
from gateway_runner import ADMIN_KEY, GatewayThread, make_settings

from gateway.cli import main

POLICY = """
providers:
  google: {kind: gemini, api_key_env: GEMINI_API_KEY}
  claude: {kind: anthropic, api_key_env: ANTHROPIC_API_KEY}
  self-hosted: {base_url: "http://127.0.0.1:9/v1"}
models:
  flash: {provider: google, upstream_model: gemini-2.5-flash}
  pro: {provider: google, upstream_model: gemini-2.5-pro}
  old-flash: {provider: google, upstream_model: gemini-1.5-flash}
  sonnet: {provider: claude, upstream_model: claude-sonnet-4-5, price: {input: 3, output: 15}}
  free: {provider: claude, upstream_model: claude-sonnet-4-5, price: {}}
  llama: {provider: self-hosted, upstream_model: gpt-4o}
"""
VERSION = f"genai-prices {metadata.version('genai-prices')}"


def test_prices_of_a_file_name_their_source(tmp_path: Path, capsys) -> None:
    policy = tmp_path / "routing_rules.yaml"
    policy.write_text(POLICY)
    assert main(["policy", "prices", str(policy), "--json"]) == 0
    rows = {row["model"]: row for row in orjson.loads(capsys.readouterr().out)}
    assert (
        rows["flash"]["source"] == VERSION
        and rows["flash"]["catalogue_model"] == "gemini-2.5-flash"
    )
    # A tiered price: higher past 200k prompt tokens, as Google bills Gemini 2.5 Pro.
    assert rows["pro"]["tiers"][0]["above_prompt_tokens"] == 200_000
    assert float(rows["pro"]["tiers"][0]["input"]) > float(rows["pro"]["input"])
    # $0.01875 a 1M tokens is no whole nano-dollar a token: rounded up, never down.
    assert rows["old-flash"]["rounded_up_from"] == {"cached_input": "0.01875"}
    assert rows["old-flash"]["cached_input"] == "0.019"
    # The policy's own price always wins; `price: {}` says "free", not "look it up".
    assert rows["sonnet"]["source"] == "policy" and rows["sonnet"]["input"] == "3"
    assert rows["free"]["source"] == "policy" and rows["free"]["output"] == "0"
    # A self-hosted OpenAI-compatible server is no provider the catalogue knows.
    assert rows["llama"]["source"] == "none"
    assert main(["policy", "prices", str(policy)]) == 0
    table = capsys.readouterr().out
    assert f"{VERSION} (gemini-2.5-pro*)" in table and "0.019^" in table


def test_prices_of_the_policy_in_force(tmp_path: Path, redis_url: str, monkeypatch, capsys) -> None:
    policy = tmp_path / "routing_rules.yaml"
    policy.write_text(POLICY)
    monkeypatch.setenv("SWITCHYARD_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("SWITCHYARD_ADMIN_KEY", ADMIN_KEY)
    with GatewayThread(make_settings(tmp_path / "gw", policy, redis_url)) as running:
        assert main(["policy", "prices", "--json", "--url", running.base_url]) == 0
    rows = orjson.loads(capsys.readouterr().out)
    assert [row["source"] for row in rows] == [
        VERSION,
        VERSION,
        VERSION,
        "policy",
        "policy",
        "none",
    ]
