"""What the request span says about the answer, gathered from a JSON body or stream chunks.

The relay already parses each chunk; ``observe_chunk`` reads the id, model, finish reasons
and usage from it (and, with prompt capture on, collects the generated text per choice).
``attributes()`` turns what was seen into ``gen_ai.response.*`` and ``gen_ai.usage.*``.
Only the tracing-enabled path creates one of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.tracing.genai import (
    FINISH_REASONS,
    OUTPUT_MESSAGES,
    RESPONSE_ID,
    RESPONSE_MODEL,
    output_messages,
    usage_attributes,
)


class ResponseSummary:
    __slots__ = ("_capture", "_finish", "_id", "_model", "_texts", "_usage")

    def __init__(self, capture_output: bool) -> None:
        self._capture = capture_output
        self._id: str | None = None
        self._model: str | None = None
        self._finish: dict[int, str] = {}
        self._texts: dict[int, list[str]] = {}
        self._usage: Mapping[str, Any] | None = None

    def _head(self, data: Mapping[str, Any]) -> None:
        if self._id is None and isinstance(data.get("id"), str):
            self._id = data["id"]
        if self._model is None and isinstance(data.get("model"), str):
            self._model = data["model"]
        if isinstance(data.get("usage"), dict):
            self._usage = data["usage"]

    def observe_response(self, data: Any) -> None:
        """A whole JSON answer (chat, completion, embeddings)."""
        if not isinstance(data, dict):
            return
        self._head(data)
        for position, choice in enumerate(data.get("choices") or ()):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", position)
            if isinstance(choice.get("finish_reason"), str):
                self._finish[index] = choice["finish_reason"]
            if self._capture:
                message = choice.get("message")
                text = message.get("content") if isinstance(message, dict) else choice.get("text")
                if isinstance(text, str):
                    self._texts[index] = [text]

    def observe_chunk(self, chunk: Any) -> None:
        """One parsed stream chunk."""
        if not isinstance(chunk, dict):
            return
        self._head(chunk)
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            if isinstance(choice.get("finish_reason"), str):
                self._finish[index] = choice["finish_reason"]
            if self._capture:
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if isinstance(text, str) and text:
                    self._texts.setdefault(index, []).append(text)

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        if self._id is not None:
            attributes[RESPONSE_ID] = self._id
        if self._model is not None:
            attributes[RESPONSE_MODEL] = self._model
        if self._finish:
            attributes[FINISH_REASONS] = [self._finish[i] for i in sorted(self._finish)]
        if self._usage is not None:
            attributes.update(usage_attributes(self._usage))
        if self._capture and (self._texts or self._finish):
            indexes = sorted(set(self._texts) | set(self._finish))
            choices = [("".join(self._texts.get(i, ())), self._finish.get(i)) for i in indexes]
            attributes[OUTPUT_MESSAGES] = output_messages(choices)
        return attributes
