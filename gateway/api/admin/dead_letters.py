"""Dead letters of the usage store over HTTP (``gateway.metering.dead_letters``).

``GET /admin/usage/dead-letters?limit=&cursor=`` (``viewer``, as the raw events): the usage
events the store could not keep, oldest first, each with why, and ``total``.
``POST /admin/usage/dead-letters/replay`` (``admin``): stores them again once the cause is
fixed, optionally with ``set`` correcting labels (each checked by the ledger's label rule, a
400 naming ``set.<field>`` otherwise), and says which were stored and which the store still
refuses. The replay is in the audit log (``usage.replay``: the corrections and how many were
stored; letter ids are hashes, which the audit log's scrubber would take for secrets). Bad parameters are a 400 naming
them; a store that cannot be read or written, a 503 (nothing is dropped then).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, field_validator
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.admins import Actor
from gateway.access.key_models import PRINTABLE, Tags, ledger_label, parse_key_payload
from gateway.api.admin.audit import record_action
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import json_response, read_json_object
from gateway.api.payloads import parse_query
from gateway.errors import InvalidRequest, ServiceUnavailable
from gateway.ledger.dead_letters import LETTER_ID_PATTERN, MAX_DEAD_LETTER_LIMIT
from gateway.ledger.event import clean_tags
from gateway.ledger.query import LedgerQueryError
from gateway.ledger.record import MAX_LABEL_LENGTH
from gateway.metering.dead_letters import DeadLetters
from gateway.services import Services

T = TypeVar("T")
MAX_REPLAY_BODY_BYTES = 64 * 1024
# A label as a correction: the ledger's rule; empty is allowed (no team, no end user).
Label = Annotated[
    StrictStr,
    Field(max_length=MAX_LABEL_LENGTH, json_schema_extra=PRINTABLE),
    AfterValidator(ledger_label),
]
LetterId = Annotated[StrictStr, Field(pattern=LETTER_ID_PATTERN)]


class DeadLetterListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: Annotated[int, Field(ge=1, le=MAX_DEAD_LETTER_LIMIT)] = 100
    cursor: Annotated[str, Field(max_length=500)] | None = None


class Corrections(BaseModel):
    """Labels to set on every replayed event (``metering.dead_letters.CORRECTABLE``)."""

    model_config = ConfigDict(extra="forbid")
    team: Label | None = None
    task: Label | None = None
    route: Label | None = None
    end_user: Label | None = None
    model: Label | None = None
    provider: Label | None = None
    policy_version: Label | None = None
    tags: Tags | None = None

    @field_validator("tags")
    @classmethod
    def _tags(cls, value: list[Any] | None) -> list[str] | None:
        return None if value is None else list(clean_tags(value, "tags"))


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ids: Annotated[list[LetterId], Field(max_length=MAX_DEAD_LETTER_LIMIT)] | None = None
    set: Corrections | None = None


async def _from_store(work: Awaitable[T]) -> T:
    try:
        return await work
    except LedgerQueryError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    except Exception as exc:  # every driver raises its own kinds
        raise ServiceUnavailable(f"the usage store is unavailable ({type(exc).__name__})") from exc


async def list_dead_letters(request: Request, services: Services, actor: Actor) -> Response:
    query = parse_query(DeadLetterListQuery, request)
    letters = DeadLetters(services.usage_store)
    return json_response(await _from_store(letters.page(query.limit, query.cursor or None)))


async def replay_dead_letters(request: Request, services: Services, actor: Actor) -> Response:
    payload = parse_key_payload(
        ReplayRequest, await read_json_object(request, MAX_REPLAY_BODY_BYTES)
    )
    corrections = payload.set.model_dump(exclude_none=True) if payload.set else {}
    letters = DeadLetters(services.usage_store)
    result = await _from_store(letters.replay(payload.ids, corrections))
    await record_action(
        services, request, actor, "usage.replay", "usage:dead-letters",
        after={"set": corrections, "replayed": len(result["replayed"]),
               "refused": len(result["refused"]), "remaining": result["remaining"]},
    )  # fmt: skip
    return json_response(result)


routes = [
    Route(
        "/admin/usage/dead-letters",
        endpoint(list_dead_letters, Guard.ADMIN, "viewer"),
        methods=["GET"],
    ),
    Route(
        "/admin/usage/dead-letters/replay",
        endpoint(replay_dead_letters, Guard.ADMIN, "admin"),
        methods=["POST"],
    ),
]
