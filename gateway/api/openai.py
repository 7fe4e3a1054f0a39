"""The OpenAI front doors: /v1/chat/completions, completions, embeddings, images, moderations,
audio speech, and the model list (``GET /v1/models``, ``GET /v1/models/{id}``).

Each is a door (``api/doors.py``) on the one pipeline (``api/pipeline.py``): chat completions
reach a provider of any chat format (translated when it speaks another); the other operations
pass through to the providers that offer them. Uploads (audio transcriptions and translations,
image edits) are in ``api/uploads.py``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.auth import client_credential
from gateway.api.doors import CHAT, COMPLETIONS, EMBEDDINGS, IMAGES, MODERATIONS, SPEECH
from gateway.api.endpoint import Guard, door_route, endpoint
from gateway.api.http import error_response, json_response
from gateway.api.pipeline import allowed_models, handle
from gateway.api.uploads import handle_speech
from gateway.errors import GatewayError, NotFound, ServiceUnavailable, echo
from gateway.routing.policy import Policy
from gateway.services import Services


async def speech(request: Request, services: Services) -> Response:
    """``POST /v1/audio/speech``: JSON in, the provider's audio bytes out."""
    return await handle_speech(request, services, SPEECH)


def _entry(name: str, policy: Policy, services: Services) -> dict[str, Any]:
    """One model of ``GET /v1/models`` (a random-weight checkpoint says so plainly)."""
    if name in policy.aliases:
        owner = policy.models[policy.aliases[name]].provider
        return {"id": name, "object": "model", "created": 0, "owned_by": owner}
    config = policy.models[name]
    entry: dict[str, Any] = {
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
    return entry


async def _visible(request: Request, services: Services) -> tuple[Policy, list[str]]:
    """The policy and the model names (then aliases) the caller's key may use."""
    principal = await services.auth.authenticate(client_credential(request.headers))
    if not services.policies.loaded:
        raise ServiceUnavailable("no routing policy is loaded", code="policy_not_loaded")
    policy = services.policies.current.policy
    allowed = allowed_models(principal, policy)
    names = [name for name in policy.models if allowed is None or name in allowed]
    names += [
        alias for alias, target in policy.aliases.items() if allowed is None or target in allowed
    ]
    return policy, names


async def list_models(request: Request, services: Services) -> Response:
    """``GET /v1/models``: the policy's models and aliases that the caller's key may use."""
    try:
        policy, names = await _visible(request, services)
        data = [_entry(name, policy, services) for name in names]
        return json_response({"object": "list", "data": data})
    except GatewayError as exc:
        return error_response(exc)


async def get_model(request: Request, services: Services) -> Response:
    """``GET /v1/models/{id}``: one model or alias the caller's key may use (else 404, as
    OpenAI answers for a model that does not exist or that the key cannot see)."""
    model_id = request.path_params["model_id"]
    try:
        policy, names = await _visible(request, services)
        if model_id not in names:
            raise NotFound(
                f"The model {echo(model_id)} does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        return json_response(_entry(model_id, policy, services))
    except GatewayError as exc:
        return error_response(exc)


# Guard.NONE: each pipeline authenticates as one of its stages, so that its errors are in the
# client's format.
routes = [
    *(door_route(door, handle) for door in (CHAT, COMPLETIONS, EMBEDDINGS, IMAGES, MODERATIONS)),
    Route("/v1/audio/speech", endpoint(speech, Guard.NONE), methods=["POST"]),
    Route("/v1/models", endpoint(list_models, Guard.NONE), methods=["GET"]),
    Route("/v1/models/{model_id:path}", endpoint(get_model, Guard.NONE), methods=["GET"]),
]
