"""The team payloads that the admin API, the dashboard and the CLI accept, checked one way.

``TeamCreate`` names the team (its id: 1 to 64 letters, digits, ``.``, ``_`` or ``-``, the
first a letter or digit) and ``TeamUpdate`` changes it; both share the limit fields: rpm, tpm,
``max_parallel_requests`` and ``budgets_usd`` (one budget per period: day, week, month,
total; USD exact to the nano-dollar), ``budget_mode`` (hard or soft) and ``alert_thresholds``
(percents of each budget, docs/limits.md#budget-alerts). Unknown fields are refused with a 400 naming them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from gateway.access.key_models import (
    AlertThresholds,
    Budget,
    BudgetMode,
    BudgetPeriod,
    Name,
    Parallel,
    Rpm,
    Tpm,
    exact_budget,
)
from gateway.access.teams import TEAM_ID_PATTERN
from gateway.money import usd_to_nanos

TeamId = Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=TEAM_ID_PATTERN)]


class _TeamFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    rpm: Rpm | None = None
    tpm: Tpm | None = None
    max_parallel_requests: Parallel | None = None
    budgets_usd: dict[BudgetPeriod, Budget] | None = Field(
        None, description="USD per period, at most 9 decimal places each"
    )
    budget_mode: BudgetMode | None = None
    alert_thresholds: AlertThresholds | None = None

    @field_validator("budgets_usd")
    @classmethod
    def _exact_budgets(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        return {period: float(exact_budget(amount) or 0) for period, amount in value.items()}

    def stored(self, given: set[str] | None = None) -> dict[str, Any]:
        """The fields for ``TeamStore`` (budgets in nano-dollars); only ``given`` ones if set."""
        names = given if given is not None else set(type(self).model_fields) - {"id"}
        out: dict[str, Any] = {}
        for name in names:
            value = getattr(self, name)
            if name == "budgets_usd":
                out["budgets_nanos"] = (
                    {period: usd_to_nanos(amount) for period, amount in value.items()}
                    if value is not None
                    else {}
                )
            else:
                out[name] = value
        return out


class TeamCreate(_TeamFields):
    id: TeamId


class TeamUpdate(_TeamFields):
    pass


class TeamListQuery(BaseModel):
    """``GET /admin/teams`` query parameters."""

    model_config = ConfigDict(extra="forbid")
    limit: Annotated[int, Field(ge=1, le=1000)] = 100
    after: Annotated[str, Field(max_length=64)] | None = None
