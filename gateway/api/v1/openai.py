"""The OpenAI front doors: /v1/chat/completions, completions, embeddings, images, moderations,
audio speech, and the model list (``GET /v1/models``, ``GET /v1/models/{id}``).

Each is a door (``api/v1/doors.py``) on the one pipeline (``api/v1/pipeline.py``): chat completions
reach a provider of any chat format (translated when it speaks another); the other operations
pass through to the providers that offer them. Uploads (audio transcriptions and translations,
image edits) are in ``api/v1/uploads.py``.

What the OpenAPI document says of their answers: the ``TypedDict`` beside what builds them
(``formats/openai_chat/response.py``, ``formats/openai_embeddings.py``; ``Model`` here), and
here those of the answers only ever relayed as the provider sent them (``ImageList``,
``Moderation``): the shape of OpenAI's API, which the gateway does not check.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.auth import client_credential
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import error_response, json_response
from gateway.api.v1.doors import CHAT, COMPLETIONS, EMBEDDINGS, IMAGES, MODERATIONS, SPEECH
from gateway.api.v1.model_availability import Availability, availability
from gateway.api.v1.pipeline import allowed_models, door_route
from gateway.api.v1.uploads import answer_speech
from gateway.errors import GatewayError, InvalidRequest, NotFound, ServiceUnavailable, echo
from gateway.policy import Policy
from gateway.services import Services


class ImageList(TypedDict):
    """An images answer (generations, edits), relayed as the provider sent it."""

    created: NotRequired[int]
    data: list[Any]


class Moderation(TypedDict):
    """A moderations answer, relayed as the provider sent it."""

    id: NotRequired[str]
    model: NotRequired[str]
    results: list[dict[str, Any]]


class _ModelEntry(TypedDict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    description: NotRequired[str]
    context_window: NotRequired[int]


class Model(_ModelEntry, Availability):
    """A model or alias of the policy that the key may use, in the list and alone."""


class ModelList(TypedDict):
    object: Literal["list"]
    data: list[Model]


def _entry(name: str, policy: Policy, services: Services, allowed: frozenset[str] | None) -> Model:
    """One model of ``GET /v1/models`` (a random-weight checkpoint says so plainly), with
    whether it can be served here now (``available``, extra fields SDKs ignore)."""
    if name in policy.aliases:
        target = policy.aliases[name]
        owner = policy.models[target].provider
        entry: _ModelEntry = {"id": name, "object": "model", "created": 0, "owned_by": owner}
        return {**entry, **availability(target, policy, services.dispatcher, allowed)}
    config = policy.models[name]
    entry = {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": config.provider,
    }
    provider = services.providers.get(config.provider, policy.providers[config.provider])
    note = provider.model_note()
    if note or config.description:
        entry["description"] = note or config.description
    if config.context_window is not None:
        entry["context_window"] = config.context_window
    return {**entry, **availability(name, policy, services.dispatcher, allowed)}


def _wanted(request: Request) -> bool | None:
    """``?available=true|false``: only the servable (or unservable) models; None: all."""
    value = request.query_params.get("available")
    if value is None:
        return None
    if value.lower() not in ("true", "false"):
        raise InvalidRequest(
            f"available must be true or false, not {echo(value)}", param="available"
        )
    return value.lower() == "true"


async def _visible(
    request: Request, services: Services
) -> tuple[Policy, list[str], frozenset[str] | None]:
    """The policy, the model names (then aliases) the caller's key may use, and its
    allow-list (None: every model)."""
    principal = await services.auth.authenticate(client_credential(request.headers))
    if not services.policies.loaded:
        raise ServiceUnavailable("no routing policy is loaded", code="policy_not_loaded")
    policy = services.policies.current.policy
    allowed = allowed_models(principal, policy)
    names = [name for name in policy.models if allowed is None or name in allowed]
    names += [
        alias for alias, target in policy.aliases.items() if allowed is None or target in allowed
    ]
    return policy, names, allowed


async def list_models(request: Request, services: Services) -> Response:
    """``GET /v1/models``: the policy's models and aliases that the caller's key may use;
    ``?available=true``: only those that can be served here now."""
    try:
        wanted = _wanted(request)
        policy, names, allowed = await _visible(request, services)
        data = [_entry(name, policy, services, allowed) for name in names]
        if wanted is not None:
            data = [entry for entry in data if entry["available"] is wanted]
        return json_response(ModelList(object="list", data=data))
    except GatewayError as exc:
        return error_response(exc)


async def get_model(request: Request, services: Services) -> Response:
    """``GET /v1/models/{id}``: one model or alias the caller's key may use (else 404, as
    OpenAI answers for a model that does not exist or that the key cannot see)."""
    model_id = request.path_params["model_id"]
    try:
        policy, names, allowed = await _visible(request, services)
        if model_id not in names:
            raise NotFound(
                f"The model {echo(model_id)} does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        return json_response(_entry(model_id, policy, services, allowed))
    except GatewayError as exc:
        return error_response(exc)


# Guard.NONE: each pipeline authenticates as one of its stages, so that its errors are in the
# client's format.
routes = [
    *(door_route(door) for door in (CHAT, COMPLETIONS, EMBEDDINGS, IMAGES, MODERATIONS)),
    door_route(SPEECH, answer_speech),
    Route("/v1/models", endpoint(list_models, Guard.NONE), methods=["GET"]),
    Route("/v1/models/{model_id:path}", endpoint(get_model, Guard.NONE), methods=["GET"]),
]
