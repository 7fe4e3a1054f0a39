"""Bad input to the usage store is refused with an error naming the field or parameter: event
fields, report queries, store URLs and settings, a schema newer than the code, a dead server."""

from __future__ import annotations

from datetime import date, datetime
from pathlib import Path

import pytest
from sqlstore_support import DAY0, at, make_events, raw_sql

from gateway.ledger import (
    LedgerQueryError,
    RollupQuery,
    StoreConfigError,
    UsageError,
    UsageEvent,
    UsageFilter,
    UsageStore,
    make_store,
    open_store,
)
from gateway.ledger.sqlite_store import SqliteStore
from gateway.settings import SettingsError, load_settings

GOOD = {
    "event_id": "u-1",
    "time_ms": at(DAY0, 60),
    "key_id": "key-a",
    "model": "gpt-4o-mini",
    "provider": "openai",
}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("event_id", ""),
        ("event_id", "has space"),
        ("event_id", "x" * 201),
        ("time_ms", 1.7e12),
        ("time_ms", 1_700_000_000),  # epoch seconds, not milliseconds
        ("time_ms", True),
        ("key_id", "{slot}"),
        ("model", "nul\x00byte"),
        ("team", 5),
        ("end_user", "a" * 201),
        ("prompt_tokens", -1),
        ("completion_tokens", 2**41),
        ("cache_write_tokens", 1.5),
        ("cost_nanos", 10**18 + 1),
        ("cost_nanos", 0.5),
        ("status", 99),
        ("status", "200"),
        ("streamed", 1),
        ("usage_source", "guess"),
        ("attempts", -2),
        ("latency_ms", 2**31),
        ("ttft_ms", -5),
        ("tags", "prod"),
        ("tags", ("a b",)),
        ("tags", ("x" * 65,)),
        ("tags", ("prod", "prod")),
        ("tags", tuple(f"t{index}" for index in range(9))),
        ("tags", ("",)),
    ],
)
def test_bad_event_fields_are_named(field: str, value: object) -> None:
    """Refused when built, or by the store's bounds (``check_storable``, run by ``insert``)."""
    with pytest.raises(UsageError) as error:
        UsageEvent(**{**GOOD, field: value}).check_storable()
    assert error.value.field == field
    assert str(error.value).startswith(f"{field}: ")


def test_cached_tokens_cannot_exceed_prompt() -> None:
    with pytest.raises(UsageError, match="cached_tokens: exceeds prompt_tokens"):
        UsageEvent(**GOOD, prompt_tokens=3, cached_tokens=4)


def test_json_round_trip_and_bad_json() -> None:
    event = make_events(1)[0]
    assert UsageEvent.from_json(event.to_json()) == event
    recorded = {**event.to_dict(), "tags": ["a", "b"]}
    assert UsageEvent.from_dict(recorded).tags == ("a", "b")
    with pytest.raises(UsageError, match="surprise: unknown field"):
        UsageEvent.from_dict({**recorded, "surprise": 1})
    with pytest.raises(UsageError, match="event_id: unknown field"):  # the JSON's request_id
        UsageEvent.from_dict({**recorded, "event_id": "x"})
    with pytest.raises(UsageError, match=r"event: .*key_id"):
        UsageEvent.from_dict({k: v for k, v in recorded.items() if k != "key_id"})
    with pytest.raises(UsageError, match="event: invalid JSON"):
        UsageEvent.from_json(b"{not json")
    with pytest.raises(UsageError, match="event: must be a JSON object"):
        UsageEvent.from_json(b"[1]")


@pytest.mark.parametrize(
    ("param", "build"),
    [
        ("group_by", lambda: RollupQuery(DAY0, date(2026, 12, 1), ("colour",))),
        ("group_by", lambda: RollupQuery(DAY0, date(2026, 12, 1), ("day", "day"))),
        ("group_by", lambda: RollupQuery(DAY0, date(2026, 12, 1), ("tag", "user"))),
        (
            "group_by",
            lambda: RollupQuery(DAY0, date(2026, 12, 1), ("tag",), UsageFilter(user="alice")),
        ),
        ("to", lambda: RollupQuery(DAY0, DAY0)),
        ("from", lambda: RollupQuery(datetime(2026, 11, 1), date(2026, 12, 1))),  # type: ignore[arg-type]
        ("to", lambda: RollupQuery(DAY0, "2026-12-01")),  # type: ignore[arg-type]
        ("tag", lambda: UsageFilter(tag="no spaces")),
        ("model", lambda: UsageFilter(model="\x07bell")),
        ("key_id", lambda: UsageFilter(key_id=7)),  # type: ignore[arg-type]
    ],
)
def test_bad_queries_are_named(param: str, build) -> None:
    with pytest.raises(LedgerQueryError) as error:
        build()
    assert error.value.param == param


def test_store_urls(tmp_path: Path) -> None:
    default = make_store("", data_dir=tmp_path)
    assert isinstance(default, SqliteStore)
    assert default.path == tmp_path / "usage" / "usage.sqlite3"
    named = make_store(f"sqlite:///{tmp_path}/other.db", data_dir=tmp_path)
    assert isinstance(named, SqliteStore) and named.path == tmp_path / "other.db"
    with pytest.raises(StoreConfigError) as wrong:
        make_store("mysql://admin:hunter2@db/usage", data_dir=tmp_path)
    assert "hunter2" not in str(wrong.value) and "mysql://admin:***@db/usage" in str(wrong.value)
    with pytest.raises(StoreConfigError, match="names a file"):
        make_store("sqlite://relative.db", data_dir=tmp_path)
    for days in (0, -1, 36_501, True):
        with pytest.raises(StoreConfigError, match="retention_days"):
            make_store("", data_dir=tmp_path, retention_days=days)  # type: ignore[arg-type]


def test_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_USAGE_STORE_URL", "mongodb://u:secret@h/db")
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert "SWITCHYARD_USAGE_STORE_URL" in str(error.value)
    assert "secret" not in str(error.value)
    monkeypatch.setenv("SWITCHYARD_USAGE_STORE_URL", "postgresql://gw@db.internal/usage")
    monkeypatch.setenv("SWITCHYARD_USAGE_RETENTION_DAYS", "0")
    with pytest.raises(SettingsError, match="SWITCHYARD_USAGE_RETENTION_DAYS"):
        load_settings()
    monkeypatch.setenv("SWITCHYARD_USAGE_RETENTION_DAYS", "30")
    settings = load_settings()
    assert (settings.usage_store.url, settings.usage_store.retention_days) == (
        "postgresql://gw@db.internal/usage",
        30,
    )


async def test_a_newer_schema_is_refused(store_url: str, store: UsageStore, tmp_path: Path) -> None:
    stamp = "0" if store.kind == "sqlite" else "now()"
    await raw_sql(
        store, f"INSERT INTO usage_schema_version (version, applied_at) VALUES (99, {stamp})"
    )
    with pytest.raises(StoreConfigError, match="schema is version 99, newer than this gateway"):
        await open_store(store_url, data_dir=tmp_path)


async def test_an_unreachable_postgres_is_a_clear_error(tmp_path: Path) -> None:
    from ports import free_port

    url = f"postgresql://gw:topsecret@127.0.0.1:{free_port()}/usage"
    with pytest.raises(StoreConfigError) as error:
        await open_store(url, data_dir=tmp_path)
    assert "cannot connect to the usage store" in str(error.value)
    assert "topsecret" not in str(error.value)
