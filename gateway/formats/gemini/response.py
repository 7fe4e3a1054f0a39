"""Gemini ``generateContent`` answers into the internal response.

The first candidate is the answer. Its parts become blocks: text, thoughts (``thought: true``),
function calls (an id made up when Gemini gave none, so a client can answer the call), and a
``thoughtSignature`` as a signed, empty ``Thinking`` block just before the part it came on, so
that it goes back on that part next turn. Parts no other format has (executable code, inline
media in answers) stay ``Raw``: only a Gemini client could show them, so translated they are a
502. Gemini says ``STOP`` after function calls too: an answer that calls a function stops for
``tool_use``. A prompt Gemini blocked is a 200 with no candidate: a refusal naming the reason.

Usage: ``promptTokenCount`` counts every prompt token, the cached ones
(``cachedContentTokenCount``) included, as the internal record does; tool-use prompts
(``toolUsePromptTokenCount``) are prompt tokens too; the answer's tokens are
``candidatesTokenCount`` plus the thinking (``thoughtsTokenCount``), which is also the
reasoning count.
"""

from __future__ import annotations

import secrets
from typing import Any

from gateway.formats import internal
from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.fields import dumps, load_upstream, upstream_int

NAME = "gemini"
_REFUSALS = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
    }
)


def parse_response(body: bytes | str | dict[str, Any]) -> internal.ChatResponse:
    data = load_upstream(body, "generateContent answer")
    usage = data.get("usageMetadata")
    candidate = first_candidate(data)
    if candidate is None:
        return internal.ChatResponse(
            id=response_id(data),
            model=str(data.get("modelVersion") or ""),
            content=[internal.Refusal(blocked_reason(data))],
            stop_reason="refusal",
            usage=parse_usage(usage) if isinstance(usage, dict) else None,
        )
    content: list[internal.Block] = []
    for part in candidate_parts(candidate):
        content.extend(parse_part(part))
    return internal.ChatResponse(
        id=response_id(data),
        model=str(data.get("modelVersion") or ""),
        content=content,
        stop_reason=parse_stop(candidate.get("finishReason"), content),
        usage=parse_usage(usage) if isinstance(usage, dict) else None,
    )


def response_id(data: dict[str, Any]) -> str:
    value = data.get("responseId")
    return value if isinstance(value, str) and value else f"gemini-{secrets.token_hex(16)}"


def first_candidate(data: dict[str, Any]) -> dict[str, Any] | None:
    candidates = data.get("candidates")
    if candidates is None:
        return None
    if not isinstance(candidates, list):
        raise UpstreamProtocolError("upstream candidates is not a list")
    if not candidates:
        return None
    candidate = candidates[0]
    if not isinstance(candidate, dict):
        raise UpstreamProtocolError("upstream candidate is not an object")
    return candidate


def candidate_parts(candidate: dict[str, Any]) -> list[dict[str, Any]]:
    content = candidate.get("content")
    if content is None:
        return []  # a candidate stopped before any part (MAX_TOKENS on thinking, SAFETY)
    parts = content.get("parts") if isinstance(content, dict) else None
    if parts is None:
        return []
    if not isinstance(parts, list) or not all(isinstance(part, dict) for part in parts):
        raise UpstreamProtocolError("upstream content parts are not a list of objects")
    return parts


def blocked_reason(data: dict[str, Any]) -> str:
    feedback = data.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    return f"Gemini blocked the prompt ({reason or 'no candidate returned'})"


def parse_part(part: dict[str, Any]) -> list[internal.Block]:
    """The blocks of one part: a signature first when the part carries one."""
    signature = part.get("thoughtSignature")
    text = part.get("text")
    if part.get("thought") is True:
        return [internal.Thinking(_string(text, "thought"), _opt_string(signature), origin=NAME)]
    blocks: list[internal.Block] = []
    if isinstance(signature, str) and signature:
        blocks.append(internal.Thinking("", signature, origin=NAME))
    if "functionCall" in part:
        blocks.append(parse_call(part["functionCall"]))
    elif text is not None:
        if text != "" or not blocks:
            blocks.append(internal.Text(_string(text, "text")))
    else:
        blocks.append(internal.Raw(NAME, part))  # executable code, inline media
    return blocks


def parse_call(call: Any) -> internal.ToolCall:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise UpstreamProtocolError("upstream functionCall has no name")
    args = call.get("args")
    if args is not None and not isinstance(args, dict):
        raise UpstreamProtocolError("upstream functionCall args is not an object")
    given = call.get("id")
    call_id = given if isinstance(given, str) and given else f"call_{secrets.token_hex(12)}"
    return internal.ToolCall(call_id, call["name"], dumps(args or {}))


def parse_stop(value: Any, content: list[internal.Block]) -> internal.StopReason | None:
    if value is None:
        return None
    if any(isinstance(block, internal.ToolCall) for block in content):
        return "tool_use"
    if value == "MAX_TOKENS":
        return "max_tokens"
    if value in _REFUSALS:
        return "refusal"
    return "end_turn"


def parse_usage(usage: dict[str, Any]) -> internal.Usage:
    what = "usageMetadata"
    prompt = upstream_int(usage, "promptTokenCount", what)
    tool_prompt = upstream_int(usage, "toolUsePromptTokenCount", what)
    thoughts = upstream_int(usage, "thoughtsTokenCount", what)
    cached = upstream_int(usage, "cachedContentTokenCount", what)
    if cached > prompt:
        raise UpstreamProtocolError("upstream usage counts more cached tokens than prompt tokens")
    return internal.Usage(
        prompt_tokens=prompt + tool_prompt,
        completion_tokens=upstream_int(usage, "candidatesTokenCount", what) + thoughts,
        cached_tokens=cached,
        reasoning_tokens=thoughts,
    )


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise UpstreamProtocolError(f"upstream {what} part has no text")
    return value


def _opt_string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
