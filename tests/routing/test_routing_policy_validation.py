"""Invalid policies are refused with the dotted path of the offending field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gateway.policy import (
    PolicyError,
    load_policy_file,
    parse_policy,
    policy_json_schema,
)
from gateway.policy.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def fleet(**block: object) -> dict[str, object]:
    return {"kind": "engine_fleet", "fleet": block}


def test_an_engine_fleet_takes_static_replicas_or_a_dns_name(policy_data) -> None:
    data = policy_data()
    data["providers"]["static"] = {
        **fleet(replicas=["http://10.0.0.1:8000", "https://[fd00::1]:8000"], routing="round_robin"),
        "spill_when": {"waiting": 8, "kv_usage": 0.95},
        "api_key_env": "ENGINE_KEY",
    }
    data["providers"]["dns"] = fleet(dns="http://engine-headless.ns.svc:8080", refresh_s=2)
    policy = parse_policy(yaml.safe_dump(data))
    static, dns = policy.providers["static"], policy.providers["dns"]
    assert static.fleet is not None and static.fleet.routing == "round_robin"
    assert static.spill_when is not None and static.spill_when.waiting == 8
    assert dns.fleet is not None and dns.fleet.dns and dns.fleet.refresh_s == 2
    assert dns.fleet.scrape.interval_ms == 250 and dns.fleet.prefix.blocks == 8


def test_batch_native_is_taken_by_openai_and_anthropic_providers(policy_data) -> None:
    data = policy_data()
    data["providers"]["alpha"]["batch"] = "native"
    data["providers"]["claude"] = {"kind": "anthropic", "batch": "native"}
    policy = parse_policy(yaml.safe_dump(data))
    assert policy.providers["alpha"].batch == policy.providers["claude"].batch == "native"
    assert policy.providers["beta"].batch == "gateway"  # the default: today's behaviour


def error_of(data: object) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        parse_policy(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return caught.value


def test_base_policy_is_valid(policy_data) -> None:
    policy = parse_policy(yaml.safe_dump(policy_data()))
    assert policy.tasks["mix"].weights == {"big": 70, "small": 20, "other": 10}
    assert policy.providers["home"].spill_when.kv_usage == 0.9
    assert policy.resolve_model("best") == "big"
    assert policy.models["big"].price.cost_nanos(1_000_000, 0, 500_000) == 1_250_000_000


def test_shipped_policy_is_valid_and_realistic() -> None:
    policy = load_policy_file(REPO / "routing_rules.yaml")
    for name in ("gpt-4.1", "gpt-4o-mini", "o3", "deepseek-chat", "gemini-2.5-pro"):
        assert name in policy.models
    assert policy.models["gpt-4.1"].price.input == 2.0
    assert {"chat", "code", "summarize", "extract", "reasoning", "embeddings"} <= set(policy.tasks)
    assert policy.default_task in policy.tasks
    assert policy.canaries and policy.canaries[0].percent <= 10
    assert any(p.kind == "local" for p in policy.providers.values())
    assert {"cheap", "best", "fast", "gpt4", "claude", "local"} <= set(policy.aliases)


@pytest.mark.parametrize(
    ("mutate", "path", "words"),
    [
        (lambda d: d["models"]["big"].update(provider="nope"), "models.big.provider", "unknown"),
        (
            lambda d: d["models"]["big"]["price"].update(input=-1),
            "models.big.price.input",
            "must not be negative",
        ),
        # Every number is finite, and a price is a whole number of nano-dollars a token.
        (
            lambda d: d["models"]["big"]["price"].update(input=float("inf")),
            "models.big.price.input",
            "finite",
        ),
        (
            lambda d: d["models"]["big"]["price"].update(output=float("nan")),
            "models.big.price.output",
            "finite",
        ),
        (
            lambda d: d["models"]["big"]["price"].update(cached_input=0.01875),
            "models.big.price.cached_input",
            "at most 3 decimal places",
        ),
        (
            lambda d: d["providers"]["alpha"].update(timeout_s=float("inf")),
            "providers.alpha.timeout_s",
            "finite",
        ),
        (
            lambda d: d["tasks"]["mix"]["weights"].update(big=float("inf")),
            "tasks.mix.weights.big",
            "finite",
        ),
        (
            lambda d: d.update(canaries=[{"from": "big", "to": "small", "percent": float("nan")}]),
            "canaries.0.percent",
            "finite",
        ),
        (lambda d: d["aliases"].update(ghost="nothing"), "aliases.ghost", "unknown model"),
        (lambda d: d["aliases"].update(big="small"), "aliases.big", "shadow"),
        (lambda d: d.update(default_task="nap"), "default_task", "unknown task"),
        (
            lambda d: d["tasks"]["chat"]["candidates"].append("gpt-9"),
            "tasks.chat.candidates.2",
            "unknown model",
        ),
        (
            lambda d: d["tasks"]["chat"].update(fallbacks=["zzz"]),
            "tasks.chat.fallbacks.0",
            "unknown",
        ),
        (lambda d: d["fallbacks"].update(other=["big"]), "fallbacks.", "cycle"),
        (lambda d: d["fallbacks"].update(ghost=["big"]), "fallbacks.ghost", "unknown"),
        (
            lambda d: d.update(canaries=[{"from": "big", "to": "nobody", "percent": 5}]),
            "canaries.0.to",
            "unknown",
        ),
        (
            lambda d: d.update(canaries=[{"from": "big", "to": "small", "percent": 150}]),
            "canaries.0.percent",
            "100",
        ),
        (
            lambda d: d.update(canaries=[{"from": "best", "to": "big", "percent": 5}]),
            "canaries.0.to",
            "different",
        ),
        (lambda d: d["tasks"]["mix"].pop("weights"), "tasks.mix.weights", "needs weights"),
        (
            lambda d: d["tasks"]["mix"]["weights"].update(big=-3),
            "tasks.mix.weights.big",
            "negative",
        ),
        (
            lambda d: d["tasks"]["mix"]["weights"].update(stranger=1),
            "tasks.mix.weights.stranger",
            "not one of",
        ),
        (
            lambda d: d["tasks"]["mix"].update(weights={"big": 0, "small": 0}),
            "tasks.mix.weights",
            "positive",
        ),
        (
            lambda d: d["tasks"]["chat"].update(weights={"big": 1}),
            "tasks.chat.weights",
            "do not apply",
        ),
        (
            lambda d: d["tasks"]["chat"].update(strategy="fastest"),
            "tasks.chat.strategy",
            "ordered",
        ),
        (
            lambda d: d["tasks"]["code"].update(max_price_per_mtok=0.1),
            "tasks.code.candidates",
            "no candidate",
        ),
        (lambda d: d["models"]["big"].update(colour="red"), "models.big.colour", "not permitted"),
        (
            lambda d: d["providers"]["alpha"].update(engine={"blocks": 4}),
            "providers.alpha",
            "local provider",
        ),
        (
            lambda d: d["providers"]["home"].update(spill_when={"kv_usage": 1.5}),
            "providers.home.spill_when.kv_usage",
            "1",
        ),
        (lambda d: d["providers"]["beta"].pop("base_url"), "providers.beta", "base_url"),
        (lambda d: d["models"].update(auto={"provider": "alpha"}), "models", "reserved"),
        (
            lambda d: d["providers"]["alpha"].update(spill_when={"waiting": 1}),
            "providers.alpha",
            "local and engine_fleet",
        ),
        (lambda d: d["providers"].update(f={"kind": "engine_fleet"}), "providers.f", "fleet"),
        (
            lambda d: d["providers"].update(f=fleet(replicas=["http://a:1"], dns="http://b:2")),
            "providers.f.fleet",
            "exactly one of replicas",
        ),
        (
            lambda d: d["providers"].update(f=fleet(replicas=["http://a:8000/v1"])),
            "providers.f.fleet",
            "no path",
        ),
        (
            lambda d: d["providers"].update(f=fleet(replicas=["a:8000"])),
            "providers.f.fleet",
            "http://",
        ),
        (
            lambda d: d["providers"].update(f=fleet(dns="http://engine-headless")),
            "providers.f.fleet",
            "port",
        ),
        (
            lambda d: d["providers"].update(f=fleet(replicas=["http://a:1"], routing="random")),
            "providers.f.fleet.routing",
            "affinity",
        ),
        (
            lambda d: d["providers"].update(
                f=fleet(replicas=["http://a:1"], scrape={"interval_ms": 1})
            ),
            "providers.f.fleet.scrape.interval_ms",
            "10",
        ),
        (
            lambda d: d["providers"].update(
                f={**fleet(replicas=["http://a:1"]), "base_url": "http://a:1/v1"}
            ),
            "providers.f",
            "not base_url",
        ),
        (
            lambda d: d["providers"]["beta"].update(fleet={"replicas": ["http://a:1"]}),
            "providers.beta",
            "only to an engine_fleet",
        ),
        (
            lambda d: d["providers"]["home"].update(batch="native"),
            "providers.home.batch",
            "batch: native applies only to openai_compatible and anthropic",
        ),
        (
            lambda d: d["providers"].update(
                az={"kind": "azure_openai", "base_url": "https://a.example", "batch": "native"}
            ),
            "providers.az.batch",
            "(this one is azure_openai)",
        ),
        (
            lambda d: d["providers"]["alpha"].update(batch="upstream"),
            "providers.alpha.batch",
            "'gateway' or 'native'",
        ),
    ],
)
def test_invalid_policy_names_the_field(policy_data, mutate, path, words) -> None:
    data = policy_data()
    mutate(data)
    error = error_of(data)
    assert error.path.startswith(path), (error.path, str(error))
    assert words in error.message, error.message


def test_fallback_cycle_message_shows_the_loop(policy_data) -> None:
    data = policy_data()
    data["fallbacks"]["other"] = ["best"]  # big -> small -> other -> big (via alias)
    error = error_of(data)
    assert "fallback cycle" in error.message
    assert "big" in error.message and "other" in error.message


def test_bad_yaml_and_non_mapping() -> None:
    assert "invalid YAML" in error_of("providers: [unclosed").message
    assert "mapping" in error_of("- just\n- a list\n").message


def test_schema_export_matches_docs(capsys) -> None:
    schema = policy_json_schema()
    assert {"providers", "models", "tasks", "canaries"} <= set(schema["properties"])
    canary = schema["$defs"]["Canary"]["properties"]
    assert {"from", "to", "percent"} <= set(canary)
    assert main(["--schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == schema
    committed = json.loads((REPO / "docs" / "policy.schema.json").read_text())
    assert committed == schema, "regenerate: python -m gateway.policy --schema > docs/..."


def test_policy_documents_are_bounded(policy_data) -> None:
    deep = "models: " + "[" * 40 + "]" * 40
    assert "nested more than 32 levels" in str(error_of(deep))
    assert "contains it" in str(error_of("models: &m {x: *m}"))
    # Shared blocks are fine: safe_dump writes a shared dict as an anchor and an alias.
    data = policy_data()
    data["models"]["other"]["price"] = data["models"]["big"]["price"]
    text = yaml.safe_dump(data)
    assert "&id001" in text and "*id001" in text
    policy = parse_policy(text)
    assert policy.models["other"].price == policy.models["big"].price


def test_a_catalogue_price_set_after_a_read_is_the_one_costed() -> None:
    """``pricing`` and ``price_catalogue`` are cached on the model; the catalogue's price
    replaces what was read before it was set."""
    policy = parse_policy(
        "providers:\n  google: {kind: gemini, api_key_env: GEMINI_API_KEY}\n"
        "models:\n  flash: {provider: google, upstream_model: gemini-2.5-flash}\n"
        "  mine: {provider: google, upstream_model: gemini-2.5-flash, price: {input: 1, output: 2}}\n"
    )
    flash, mine = policy.models["flash"], policy.models["mine"]
    assert flash.price_catalogue.startswith("genai-prices ")
    assert mine.price_catalogue == "" and mine.pricing is mine.price
    assert mine.pricing.cost_nanos(1_000_000, 0) == 1_000_000_000
    mine.set_catalogue_price(flash.pricing)
    assert mine.pricing is flash.pricing and mine.price_catalogue == flash.price_catalogue
