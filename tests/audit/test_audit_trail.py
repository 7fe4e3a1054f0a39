"""The audit trail: an entry is durable when ``record`` returns, in the store or, when the
store cannot take it, in the local spool that is fed back once the store is there again (each
entry stored once); and no secret survives into an entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.access.admins import Actor
from gateway.audit.scrub import audit_json, scrubbed
from gateway.audit.trail import AuditTrail, entry_view
from gateway.ledger.audit import AuditQuery
from gateway.settings import UsageStoreSettings


class _Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.events.append(event)


def _trail(tmp_path: Path, url: str, log: _Log) -> AuditTrail:
    return AuditTrail(UsageStoreSettings(url=url, retention_days=30), tmp_path / "data", log)


async def test_an_entry_waits_in_the_spool_while_the_store_is_away(tmp_path: Path) -> None:
    blocker = tmp_path / "store"
    blocker.write_text("a file where the store's folder must be")
    url = f"sqlite:///{blocker / 'usage.sqlite3'}"
    log = _Log()
    trail = _trail(tmp_path, url, log)
    await trail.start()
    try:
        assert trail.store is None and "audit_store_unavailable" in log.events
        operator = Actor("token", "tok123", "ops-bot", "operator")
        first = await trail.record(
            operator,
            "key.rotate",
            "key:abc",
            client="10.1.2.3",
            before={"rpm": 1},
            after={"rpm": 2},
        )
        assert trail.spool.depth() == 1 and "audit_entry_spooled" in log.events
        blocker.unlink()  # the store can open now
        await trail.open_store()
        assert await trail.replay() == 1 and await trail.replay() == 0
        second = await trail.record(Actor.bootstrap(), "team.delete", "team:t", client="::1")
        page = await trail.query(AuditQuery())
        assert [e.event_id for e in page.entries] == [second.event_id, first.event_id]
        view = entry_view(page.entries[1])
        assert view["actor_name"] == "ops-bot" and view["before"] == {"rpm": 1}
        assert view["after"] == {"rpm": 2} and view["client"] == "10.1.2.3"
    finally:
        await trail.stop()


def test_secrets_never_reach_an_entry() -> None:
    value = {
        "id": "k1",
        "key": "sk-sy-abcdefghijklmnop-0123456789012345678901234567890123456789",
        "token": "sy-tok-x",
        "secret_hash": "f" * 64,
        "nested": {"rotation_salt": "00ff", "note": "Bearer abcdefghijk", "ok": 3},
        "list": ["sy-admin-0123456789abcdef", "fine"],
        "metadata": {"owner": "ana"},
    }
    cleaned = scrubbed(value)
    assert cleaned == {
        "id": "k1",
        "nested": {"note": "Bearer [redacted]", "ok": 3},
        "list": ["[redacted]", "fine"],
        "metadata": {"owner": "ana"},
    }
    assert audit_json(None) is None
    assert "sk-sy-" not in (audit_json(value) or "")
