"""The key payloads that the admin API and the CLI both accept, checked the same way.

``KeyCreate`` and ``KeyUpdate`` share their fields: names, allow-list, limits, budget (USD exact
to the nano-dollar), expiry (unix time or ISO 8601) and metadata (at most 4 KiB as JSON).
Every model forbids unknown fields; ``parse_key_payload`` turns a refusal into the 400 naming
the first bad field, for a JSON body and for command-line flags alike.
"""

from __future__ import annotations

import contextlib
import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from gateway.errors import InvalidRequest, invalid_input
from gateway.ledger.event import MAX_TAG_LENGTH, MAX_TAGS, clean_tags
from gateway.ledger.record import MAX_LABEL_LENGTH, label_problem
from gateway.money import MAX_BUDGET_USD, usd_to_nanos
from gateway.policy import Policy

MAX_METADATA_BYTES = 4096
MAX_GRACE_S = 30 * 24 * 3600


def ledger_label(value: str) -> str:
    """A name that may end up in the usage ledger, under the ledger's own label rule."""
    problem = label_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# The label rule as the OpenAPI document states it: the rule refuses every non-printable
# character, the pattern names the ASCII and Latin-1 ones.
PRINTABLE = {
    "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",
    "description": "printable characters only (no tab, newline or other control character)",
}
# A key's name and team, a team's or admin token's name, an allow-listed model: the ledger's
# label rule, so nothing accepted here can make the usage store refuse an event later.
Name = Annotated[
    StrictStr,
    Field(min_length=1, max_length=MAX_LABEL_LENGTH, json_schema_extra=PRINTABLE),
    AfterValidator(ledger_label),
]
Rpm = Annotated[StrictInt, Field(ge=0, le=10_000_000)]
Tpm = Annotated[StrictInt, Field(ge=0, le=10_000_000_000)]
Parallel = Annotated[StrictInt, Field(ge=0, le=1_000_000)]
BudgetPeriod = Literal["day", "week", "month", "total"]
BudgetMode = Annotated[
    Literal["hard", "soft"], Field(description="hard refuses past the budget; soft only alerts")
]
# USD, exact to the nano-dollar, and small enough that the limiter's Lua doubles stay exact.
Budget = Annotated[
    StrictFloat | StrictInt,
    Field(
        ge=0,
        le=MAX_BUDGET_USD,
        allow_inf_nan=False,
        description="USD with at most 9 decimal places (kept as integer nano-dollars)",
    ),
]
MetadataValue = StrictStr | StrictInt | StrictFloat | bool | None


def exact_budget(value: float | None) -> float | None:
    """A budget in USD that converts to nano-dollars exactly (else a 400 naming the field)."""
    if value is None:
        return None
    usd_to_nanos(value)  # at most 9 decimal places
    return float(value)


def unique_thresholds(value: list[int] | None) -> list[int] | None:
    """Alert thresholds, ascending; a repeated one is refused (it would alert twice)."""
    if value is None:
        return None
    if len(set(value)) != len(value):
        raise ValueError("must not repeat a threshold")
    return sorted(value)


# Alert thresholds: whole percents of a budget, at most 10 of them, kept ascending.
AlertThresholds = Annotated[
    list[Annotated[StrictInt, Field(ge=1, le=100)]],
    Field(
        max_length=10,
        description="percents of the budget; each crossing is a signed webhook",
        json_schema_extra={"uniqueItems": True},
    ),
    AfterValidator(unique_thresholds),
]
# Tags, checked by the ledger's tag rule (``clean_tags``, which also drops repeats).
Tags = Annotated[
    list[Any],
    WithJsonSchema(
        {
            "type": "array",
            "maxItems": MAX_TAGS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_TAG_LENGTH},
            "description": "letters, digits and - _ . : / = @",
        }
    ),
]
# ``expires_at``: read by ``_timestamp``.
Expiry = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string"}],
            "description": "unix timestamp (a number, or a string of one) or ISO 8601 "
            "date-time (UTC if no zone), in the future",
        }
    ),
]


def _timestamp(value: Any) -> float | None:
    """``expires_at`` as epoch seconds: a number, or an ISO 8601 string (UTC if no zone)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("must be a unix timestamp or an ISO 8601 date-time")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            raise ValueError("must be a positive unix timestamp")
        return float(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return _timestamp(float(value))
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("must be a unix timestamp or an ISO 8601 date-time") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    raise ValueError("must be a unix timestamp or an ISO 8601 date-time")


class _KeyFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Name | None = None
    team: Name | None = None
    models: Annotated[list[Name], Field(max_length=1000)] | None = None
    rpm: Rpm | None = None
    tpm: Tpm | None = None
    budget_usd: Budget | None = None
    budget_period: BudgetPeriod | None = None
    max_parallel_requests: Parallel | None = None
    budget_mode: BudgetMode | None = None
    alert_thresholds: AlertThresholds | None = None
    tags: Tags | None = Field(
        None, description="tags of the key's requests that name none of their own"
    )
    expires_at: Expiry | None = None
    metadata: dict[Annotated[str, Field(max_length=100)], MetadataValue] | None = Field(
        None, description=f"at most {MAX_METADATA_BYTES} bytes as JSON"
    )

    @field_validator("expires_at", mode="before")
    @classmethod
    def _expiry(cls, value: Any) -> float | None:
        return _timestamp(value)

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[Any] | None) -> list[str] | None:
        return None if value is None else list(clean_tags(value, "tags"))

    @field_validator("budget_usd")
    @classmethod
    def _exact_budget(cls, value: float | None) -> float | None:
        return exact_budget(value)

    @field_validator("metadata")
    @classmethod
    def _small_metadata(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and len(orjson.dumps(value)) > MAX_METADATA_BYTES:
            raise ValueError(f"must serialize to at most {MAX_METADATA_BYTES} bytes")
        return value


class KeyCreate(_KeyFields):
    pass


class KeyUpdate(_KeyFields):
    pass


class RotateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grace_seconds: Annotated[StrictInt | StrictFloat, Field(ge=0, le=MAX_GRACE_S)] = 0


class KeyListQuery(BaseModel):
    """``GET /admin/keys`` query parameters."""

    model_config = ConfigDict(extra="forbid")
    limit: Annotated[int, Field(ge=1, le=1000)] = 50
    after: (
        Annotated[str, Field(max_length=200, description="the last id of the previous page")] | None
    ) = None
    team: Annotated[str, Field(max_length=200)] | None = None
    status: Literal["active", "revoked", "expired"] | None = None


def check_models(policy: Policy | None, models: list[str] | None) -> None:
    """Every allow-list entry must be a model or alias of the policy in force."""
    if models is None or policy is None:
        return
    for index, name in enumerate(models):
        if policy.resolve_model(name) is None:
            raise InvalidRequest(
                f"models[{index}]: unknown model or alias {name!r}", param=f"models[{index}]"
            )


KeyPayload = TypeVar("KeyPayload", bound=BaseModel)


def parse_key_payload(model: type[KeyPayload], data: dict[str, Any]) -> KeyPayload:
    """``data`` (a JSON body, or the CLI's flags) as ``model``; InvalidRequest naming the first
    bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc, "unknown field") from None
