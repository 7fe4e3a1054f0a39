"""OpenAI's usage object, read the same way for Chat Completions and the Responses API.

Both formats count the same things under two namings: ``prompt_tokens`` / ``completion_tokens``
with ``*_tokens_details`` in Chat Completions, ``input_tokens`` / ``output_tokens`` in the
Responses API. Cache reads and writes are part of the prompt count (as in the internal record)
and reasoning tokens part of the completion count. Rendering stays with each format: their
bodies differ in which details they always show.
"""

from __future__ import annotations

from typing import Any

from gateway.formats.errors import UpstreamProtocolError
from gateway.formats.fields import upstream_int
from gateway.formats.internal import Usage


def parse_openai_usage(usage: dict[str, Any], prompt: str, completion: str) -> Usage:
    """``prompt`` and ``completion`` are the format's names for the two counts (``"prompt"``
    and ``"completion"``, or ``"input"`` and ``"output"``)."""
    prompt_key, completion_key = f"{prompt}_tokens", f"{completion}_tokens"
    prompt_details = _details(usage, f"{prompt_key}_details")
    completion_details = _details(usage, f"{completion_key}_details")
    record = Usage(
        prompt_tokens=upstream_int(usage, prompt_key, "usage"),
        completion_tokens=upstream_int(usage, completion_key, "usage"),
        cached_tokens=upstream_int(prompt_details, "cached_tokens", f"usage.{prompt_key}_details"),
        cache_write_tokens=upstream_int(
            prompt_details, "cache_write_tokens", f"usage.{prompt_key}_details"
        ),
        reasoning_tokens=upstream_int(
            completion_details, "reasoning_tokens", f"usage.{completion_key}_details"
        ),
    )
    if record.uncached_prompt_tokens < 0:
        raise UpstreamProtocolError(
            f"upstream usage counts more cached tokens than {prompt} tokens"
        )
    return record


def _details(usage: dict[str, Any], key: str) -> dict[str, Any]:
    details = usage.get(key)
    return details if isinstance(details, dict) else {}
