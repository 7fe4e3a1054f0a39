"""OpenAI's embeddings request and answer, for providers that embed in another format (Gemini,
Vertex AI, Bedrock): the texts a body asks to embed, and the answer a client expects.

The request is ``{"model", "input": text | [texts], "dimensions"?, "encoding_format"?}``;
token arrays (lists of integers) are OpenAI's own and are refused by name. The answer is a
``list`` of ``embedding`` objects in input order, each vector as floats or, when the client
asked ``encoding_format: base64`` (the openai SDK's default), as the base64 of little-endian
float32s; ``usage`` is there when the provider counted the tokens, else left out (the gateway
then estimates them).
"""

from __future__ import annotations

import base64
import struct
from typing import Any, NotRequired, TypedDict

from gateway.formats.errors import MalformedRequest, UpstreamProtocolError


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(TypedDict):
    """An embeddings answer: the gateway's, from a provider that embeds in another format, or
    an OpenAI provider's, relayed as it sent it (only ``data`` is sure there)."""

    object: NotRequired[str]
    data: list[Any]
    model: NotRequired[str]
    usage: NotRequired[EmbeddingUsage]


def embedding_inputs(body: dict[str, Any]) -> list[str]:
    """The texts to embed, in order."""
    value = body.get("input")
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise MalformedRequest(
            "input must be a string or a non-empty array of strings", param="input"
        )
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise MalformedRequest(
                f"input[{index}] must be a string: this provider embeds text, not token ids",
                param=f"input[{index}]",
            )
    return texts


def embedding_dimensions(body: dict[str, Any]) -> int | None:
    value = body.get("dimensions")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise MalformedRequest("dimensions must be a positive integer", param="dimensions")
    return value


def render_embeddings(
    body: dict[str, Any], vectors: list[Any], model: str, prompt_tokens: int | None
) -> EmbeddingList:
    """The OpenAI answer for ``body``'s texts embedded as ``vectors`` (lists of numbers)."""
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    for index, vector in enumerate(vectors):
        if not isinstance(vector, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in vector
        ):
            raise UpstreamProtocolError("upstream embedding is not a list of numbers")
        embedding: Any = vector
        if as_base64:
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    answer: EmbeddingList = {"object": "list", "data": data, "model": model}
    if prompt_tokens is not None:
        answer["usage"] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return answer
