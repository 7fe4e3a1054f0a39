"""The rules for carrying a request into a format other than the client's.

Shared by every renderer so that each applies them the same way: fields the source marked
unportable are refused by name, ``Raw`` data reaches only its own format, and a modelled field
the target lacks is refused unless it holds its neutral value (then dropping it changes nothing).
Hints whose loss is harmless (``cache_control``, image ``detail``) are dropped by the renderers.
"""

from __future__ import annotations

from typing import Any

from gateway.formats.errors import Untranslatable, UpstreamProtocolError
from gateway.formats.internal import ChatRequest, FormatName, Raw

TITLES: dict[FormatName, str] = {
    "openai_chat": "OpenAI Chat Completions",
    "anthropic_messages": "Anthropic Messages",
    "openai_responses": "OpenAI Responses",
    "gemini": "Gemini",
    "bedrock_converse": "Bedrock Converse",
}


def check_unportable(request: ChatRequest, target: FormatName) -> None:
    if request.same_format(target):
        return
    for path, why in request.unportable.items():
        raise Untranslatable(path, TITLES[target], why)


def raw_data(raw: Raw, target: FormatName, fallback_path: str = "content") -> dict[str, Any]:
    """A ``Raw`` item's data for its own format; for any other, a 400 naming where it was."""
    if raw.format == target:
        return raw.data
    kind = raw.data.get("type")
    what = f"{kind!r} items" if isinstance(kind, str) else "this item"
    raise Untranslatable(
        raw.path or fallback_path,
        TITLES[target],
        f"{what} exist only in the {TITLES[raw.format]} API",
    )


def raw_output(raw: Raw, target: FormatName) -> dict[str, Any]:
    """The same for an upstream's answer: content the client's format cannot show is a 502."""
    if raw.format == target:
        return raw.data
    raise UpstreamProtocolError(
        f"the upstream answered with {raw.data.get('type')!r} content, which the "
        f"{TITLES[target]} API cannot carry"
    )


def refuse_unless(
    request: ChatRequest, name: str, target: FormatName, value: Any, neutral: Any, why: str
) -> None:
    """A modelled field the target lacks: fine at its neutral value, otherwise a 400."""
    if value is None or value == neutral:
        return
    raise Untranslatable(request.field_name(name), TITLES[target], why)


def merge_extras(body: dict[str, Any], request: ChatRequest, target: FormatName) -> None:
    """Same-format requests get back the fields this shape does not model (unknown ones too)."""
    if request.same_format(target):
        for key, value in request.extras.items():
            body.setdefault(key, value)


def refuse_cache_warming(request: ChatRequest, target: FormatName) -> None:
    """Anthropic's ``max_tokens: 0`` only warms its prompt cache; no other format can ask that."""
    if request.max_tokens == 0:
        raise Untranslatable(
            request.field_name("max_tokens"),
            TITLES[target],
            "0 only warms Anthropic's prompt cache",
        )
