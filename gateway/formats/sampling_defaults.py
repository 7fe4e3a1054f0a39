"""A model's sampling defaults (the policy's ``defaults:``) in each chat wire format.

Whether the request set a value is read from the client's body in the client's format (its
own field names); the default then goes into the body sent upstream under the provider
format's names. So a translation never hides a choice of the client (an Anthropic body always
sets ``max_tokens``) and never drops a default (an OpenAI body without ``max_tokens`` sent to
an Anthropic provider gets the model's, not the provider's ``default_max_tokens``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.formats.internal import FormatName

# default name -> the fields that carry it in each format (the first is the one written: for
# Chat Completions the current name, which o-series models require, as the renderer writes)
_FIELDS: dict[FormatName, dict[str, tuple[str, ...]]] = {
    "openai_chat": {
        "temperature": ("temperature",),
        "top_p": ("top_p",),
        "max_tokens": ("max_completion_tokens", "max_tokens"),
    },
    "anthropic_messages": {
        "temperature": ("temperature",),
        "top_p": ("top_p",),
        "max_tokens": ("max_tokens",),
    },
    "openai_responses": {
        "temperature": ("temperature",),
        "top_p": ("top_p",),
        "max_tokens": ("max_output_tokens",),
    },
}


def unset_defaults(
    client: FormatName, raw: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """The defaults (name -> value, unset ones left out) the client's body does not set."""
    fields = _FIELDS[client]
    return {
        name: value
        for name, value in defaults.items()
        if value is not None and all(raw.get(field) is None for field in fields[name])
    }


def apply_defaults(
    target: FormatName, body: dict[str, Any], values: Mapping[str, Any], *, legacy: bool = False
) -> dict[str, Any]:
    """``body`` (in ``target``'s format) with ``values`` written under that format's names;
    ``legacy``: a /v1/completions body, whose only limit field is ``max_tokens``."""
    if not values:
        return body
    fields = _FIELDS[target]
    named = {fields[name][0]: value for name, value in values.items()}
    if legacy and "max_completion_tokens" in named:
        named["max_tokens"] = named.pop("max_completion_tokens")
    return {**body, **named}
