"""Limiter settles and releases that Redis did not take, as spool lines until it does.

When a settle batch fails (Redis killed, restarting, timing out) its usage events go to the
usage spool and its settles and releases to this one (``DATA_DIR/settle-spool``, the same
append-only, fsync'ed format: ``gateway/metering/spool.py``). The settle batch replays them
once Redis answers, so a budget's ``spent`` and ``reserved`` end where the usage store says.

A line is safe to apply twice: the settle script applies a request id's ``held`` entry once
and deletes it, so a line whose first try landed (only the reply was lost) is a no-op, and so
is a release of a reservation that is already gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.metering.limits import Reservation

SettleMode = Literal["settle", "release"]


class SettleLineError(ValueError):
    """A spool line that is not a settle (torn by a crash, or edited by hand)."""


@dataclass(frozen=True)
class SpooledSettle:
    """One settle (``tokens`` and ``cost_nanos`` used) or release of a reservation."""

    mode: SettleMode
    reservation: Reservation
    tokens: int = 0
    cost_nanos: int = 0

    def to_json(self) -> bytes:
        held = self.reservation
        return orjson.dumps(
            {
                "mode": self.mode,
                "tokens": self.tokens,
                "cost_nanos": self.cost_nanos,
                "key_id": held.key_id,
                "request_id": held.request_id,
                "held_tokens": held.tokens,
                "held_nanos": held.cost_nanos,
                "at": held.at,
                "budget_window": held.budget_window,
                "home": held.home,
                "alert_budget_nanos": held.alert_budget_nanos,
                "alert_thresholds": list(held.alert_thresholds),
            }
        )

    @classmethod
    def from_json(cls, line: bytes) -> SpooledSettle:
        try:
            data: dict[str, Any] = orjson.loads(line)
            mode = data["mode"]
            if mode not in ("settle", "release"):
                raise SettleLineError(f"unknown mode {mode!r}")
            reservation = Reservation(
                key_id=_text(data["key_id"]),
                request_id=_text(data["request_id"]),
                tokens=_count(data["held_tokens"]),
                cost_nanos=_count(data["held_nanos"]),
                at=float(data["at"]),
                budget_window=_optional(data["budget_window"]),
                home=_optional(data["home"]),
                alert_budget_nanos=None
                if data["alert_budget_nanos"] is None
                else _count(data["alert_budget_nanos"]),
                alert_thresholds=tuple(_count(t) for t in data["alert_thresholds"]),
            )
            return cls(mode, reservation, _count(data["tokens"]), _count(data["cost_nanos"]))
        except SettleLineError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SettleLineError(f"not a settle line: {type(exc).__name__}") from exc


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise SettleLineError("an id must be a non-empty string")
    return value


def _optional(value: Any) -> str | None:
    return None if value is None else _text(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SettleLineError("a count must be a non-negative integer")
    return value
