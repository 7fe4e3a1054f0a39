"""Every variable of docs/configuration.md, set in the environment, lands where the code reads
it: a general setting on ``Settings``, a part's on its section (``settings.retry``...), under
the flat ``SWITCHYARD_*`` name it always had. A keyword argument may name a variable too, and
wins over the environment; a .env file is read below both; a bad value is refused naming the
variable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types
import pytest
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from gateway.settings import (
    ENV_PREFIX,
    RetrySettings,
    Settings,
    SettingsError,
    load_settings,
    sections,
    variables,
)

ROOT = Path(__file__).resolve().parents[1]

# Values whose form a validator checks (or that must agree with another), and what they read as.
SPECIAL: dict[str, tuple[str, Any]] = {
    "host": ("10.1.2.3", "10.1.2.3"),
    "redis_url": ("redis://127.0.0.1:6390/2", "redis://127.0.0.1:6390/2"),
    "data_dir": ("/srv/switchyard-data", Path("/srv/switchyard-data")),
    "policy_file": ("/etc/switchyard/rules.yaml", Path("/etc/switchyard/rules.yaml")),
    "admin_key": ("sy-admin-" + "a" * 20, "sy-admin-" + "a" * 20),
    "key_pepper": ("p" * 32, "p" * 32),
    "metrics_token": ("m" * 24, "m" * 24),
    "trusted_proxies": ("10.0.0.0/8,192.0.2.1", "10.0.0.0/8,192.0.2.1"),
    "usage_store_url": ("postgresql://sy@db.internal:5433/usage", None),
    "alert_webhook_url": ("https://hooks.example/alerts", "https://hooks.example/alerts"),
    "alert_webhook_secret": ("s" * 20, "s" * 20),
}


def documented_variables() -> list[str]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    return re.findall(r"^\| `(SWITCHYARD_[A-Z0-9_]+)` \|", text, re.M)


def field_of(path: tuple[str, ...]) -> FieldInfo:
    if len(path) == 1:
        return Settings.model_fields[path[0]]
    return sections()[path[0]].model_fields[path[1]]


def read(settings: Settings, path: tuple[str, ...]) -> Any:
    value: Any = settings
    for name in path:
        value = getattr(value, name)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def bounds(field: FieldInfo) -> tuple[float, float]:
    low, high = float("-inf"), float("inf")
    for rule in field.metadata:
        if isinstance(rule, annotated_types.Ge | annotated_types.Gt):
            low = float(getattr(rule, "ge", getattr(rule, "gt", low)))
        if isinstance(rule, annotated_types.Le | annotated_types.Lt):
            high = float(getattr(rule, "le", getattr(rule, "lt", high)))
    return low, high


def other_value(name: str, field: FieldInfo) -> tuple[str, Any]:
    """A valid value other than the default, as text for the environment and as read."""
    if name in SPECIAL:
        return SPECIAL[name]
    default, annotation = field.default, field.annotation
    if annotation is bool:
        return str(not default).lower(), not default
    if get_origin(annotation) is Literal:
        choice = next(option for option in get_args(annotation) if option != default)
        return choice, choice
    low, high = bounds(field)
    if annotation is int:
        value = default + 1 if default + 1 <= high else default - 1
        assert low <= value <= high, name
        return str(value), value
    if annotation is float:
        step = min(0.25, (high - default) / 2) if high > default else -min(0.25, default / 2)
        value = default + step
        assert low <= value <= high and value != default, name
        return repr(value), value
    raise AssertionError(f"{name}: no test value for {annotation}")


def test_every_documented_variable_reaches_the_field_the_code_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    documented = documented_variables()
    assert len(documented) == len(set(documented)) == len(variables())
    expected: dict[tuple[str, ...], Any] = {}
    for variable in documented:
        name = variable.removeprefix(ENV_PREFIX).lower()
        path = variables()[name]
        text, value = other_value(name, field_of(path))
        monkeypatch.setenv(variable, text)
        expected[path] = value
    settings = load_settings(_env_file=None)
    for path, value in expected.items():
        if value is None:  # read as the store's check gives it back
            continue
        assert read(settings, path) == value, path
    assert settings.usage_store.url.startswith("postgresql://sy@db.internal:5433/usage")
    # Each part's section is the one object its part is handed: no copy of a field elsewhere.
    assert settings.retry.max_tries_per_candidate == 4
    assert "upstream_max_tries" not in Settings.model_fields


def test_a_keyword_names_a_variable_and_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SWITCHYARD_UPSTREAM_MAX_TRIES", "5")
    monkeypatch.setenv("SWITCHYARD_UPSTREAM_BACKOFF_JITTER_S", "0")
    settings = load_settings(_env_file=None, upstream_max_tries=2)
    assert settings.retry == RetrySettings(max_tries_per_candidate=2, jitter_s=0.0)
    # A whole section given is taken as it is (the environment's values for it are not mixed in).
    given = load_settings(_env_file=None, retry=RetrySettings(total_budget_s=9))
    assert given.retry == RetrySettings(total_budget_s=9)


def test_a_dotenv_file_is_read_for_sections_below_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text("SWITCHYARD_AUTH_FAILURE_LIMIT=7\nSWITCHYARD_ALERT_TIMEOUT_S=3\n")
    monkeypatch.setenv("SWITCHYARD_AUTH_FAILURE_LIMIT", "8")
    settings = load_settings(_env_file=dotenv)
    assert (settings.throttle.limit, settings.alerts.timeout_s) == (8, 3.0)


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("SWITCHYARD_UPSTREAM_POOL_SIZE", "0", "greater than or equal to 1"),
        ("SWITCHYARD_AUTH_CACHE_TTL_S", "2", "less than or equal to 1"),
        ("SWITCHYARD_ALERT_WEBHOOK_URL", "ftp://x", "http:// or https://"),
        ("SWITCHYARD_USAGE_RETENTION_DAYS", "0", "greater than or equal to 1"),
        ("SWITCHYARD_HEADER_TIMEOUT_S", "never", "valid number"),
    ],
)
def test_a_bad_value_in_a_section_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, words: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings(_env_file=None)
    assert f"{variable}: " in str(caught.value) and words in str(caught.value)
