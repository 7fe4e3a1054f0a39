"""Amazon Bedrock Runtime: ``Converse`` (``{base_url}/model/{model}/converse``) and
``ConverseStream`` (``/converse-stream``), signed with AWS Signature V4.

Converse is one format for every model Bedrock serves (Anthropic's, Meta's Llama, Mistral,
Amazon Nova ...); clients of every format are translated into it by the gateway
(``gateway/formats/bedrock_converse``). The model id goes in the path URI-encoded (ARNs of
inference profiles hold ``:`` and ``/``), exactly as signed. ConverseStream answers with AWS's
binary event stream: ``BedrockEventStream`` decodes it as it arrives (CRC-checked,
``aws_eventstream``) and yields each event as one JSON object named by its type, which the
Converse stream parser reads. An exception event mid-stream (a throttle, a model error) ends
the stream with that error; a ``ThrottlingException`` before any byte is a 429, which the
dispatcher falls back on and the breaker counts.

Two operations of other doors are served from their bodies: ``/v1/embeddings`` (OpenAI's) as
``InvokeModel`` on Amazon Titan (one text a call, the calls side by side; Titan counts the
tokens) or Cohere embedding models (all texts in one call; Cohere's body counts none, so the
gateway estimates), and ``/v1/messages/count_tokens`` (Anthropic's) as ``CountTokens`` over
the Converse form of the request.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from yarl import URL

from gateway.errors import UpstreamError
from gateway.formats import anthropic_messages, bedrock_converse
from gateway.formats.anthropic_messages.response import TokenCount
from gateway.formats.errors import ErrorInfo, FormatError, MalformedRequest, UpstreamProtocolError
from gateway.formats.openai_embeddings import (
    embedding_dimensions,
    embedding_inputs,
    render_embeddings,
)
from gateway.policy import ProviderConfig
from gateway.providers.aws_eventstream import EventMessage, EventStreamDecoder, EventStreamError
from gateway.providers.aws_sigv4 import AwsCredentialSource, missing_botocore, sign_v4
from gateway.providers.base import Headers, UpstreamResponse
from gateway.providers.cloud_http import COUNT_TOKENS_PATH, EMBEDDINGS_PATH, CloudHttpProvider
from gateway.providers.http_upstream import HttpUpstream
from gateway.settings import UpstreamSettings

CHAT_PATH = "/converse"
_OPERATIONS = {EMBEDDINGS_PATH: "invoke", COUNT_TOKENS_PATH: "count-tokens"}
# Titan embeds one text a call: at most this many calls of one request at once.
TITAN_PARALLEL = 8


def botocore_installed() -> bool:
    """Whether the ``bedrock`` extra is there, without importing it (0.4 s) on the loop."""
    try:
        return importlib.util.find_spec("botocore") is not None
    except ValueError:  # in sys.modules as None: blocked
        return False


JSON = "application/json"


class BedrockProvider(CloudHttpProvider):
    def __init__(self, name: str, config: ProviderConfig, upstream: UpstreamSettings) -> None:
        assert config.bedrock is not None  # the policy requires it for this kind
        if not botocore_installed():
            raise missing_botocore(name)
        self.region = config.bedrock.region
        self.credentials = AwsCredentialSource(name, config.bedrock.profile)
        super().__init__(name, config, upstream)

    door_paths = frozenset({EMBEDDINGS_PATH, COUNT_TOKENS_PATH})

    def serves(self, path: str) -> bool:
        return path == CHAT_PATH or path in self.door_paths

    def endpoint(self, path: str, model: str, *, stream: bool) -> str:
        operation = _OPERATIONS.get(path) or ("converse-stream" if stream else "converse")
        return f"{self.base_url}/model/{quote(model, safe='')}/{operation}"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {}  # every request is signed (authorize)

    async def authorize(self, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        credentials = await self.credentials.current()
        signed = sign_v4(credentials, self.region, "POST", url, {"content-type": JSON}, body)
        return {**headers, **signed}

    def read_error(self, status: int, body: bytes) -> ErrorInfo:
        return bedrock_converse.parse_error(status, body)

    async def embeddings(self, body: dict[str, Any], headers: Headers | None) -> UpstreamResponse:
        model = str(body.get("model") or "")
        try:
            texts, dimensions = embedding_inputs(body), embedding_dimensions(body)
            if "titan-embed" not in model and "cohere.embed" not in model:
                raise MalformedRequest(
                    f"model: Bedrock embeds with Amazon Titan or Cohere models, not {model!r}",
                    param="model",
                )
        except FormatError as exc:
            raise self.refusal(exc) from None
        if "titan-embed" in model:
            return await self._titan(body, model, texts, dimensions, headers)
        if dimensions is not None:
            raise self.refusal(
                MalformedRequest(
                    "dimensions: Cohere models on Bedrock embed at their own size",
                    param="dimensions",
                )
            )
        payload: dict[str, Any] = {"texts": texts, "input_type": "search_document"}
        reply = await self.call_json(EMBEDDINGS_PATH, model, payload, headers)
        vectors = reply.data.get("embeddings")
        if isinstance(vectors, dict):  # embedding_types asked: {"float": [...]}
            vectors = vectors.get("float")
        if not isinstance(vectors, list) or len(vectors) != len(texts):
            raise self.http.protocol_error("answered InvokeModel with other embeddings")
        return self._answered(body, vectors, model, None)

    async def _titan(
        self,
        body: dict[str, Any],
        model: str,
        texts: list[str],
        dimensions: int | None,
        headers: Headers | None,
    ) -> UpstreamResponse:
        gate = asyncio.Semaphore(TITAN_PARALLEL)

        async def embed(text: str) -> dict[str, Any]:
            payload: dict[str, Any] = {"inputText": text}
            if dimensions is not None:
                payload["dimensions"] = dimensions
            async with gate:
                return (await self.call_json(EMBEDDINGS_PATH, model, payload, headers)).data

        answers = await asyncio.gather(*(embed(text) for text in texts))
        tokens = 0
        for answer in answers:
            count = answer.get("inputTextTokenCount")
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise self.http.protocol_error("answered InvokeModel without a token count")
            tokens += count
        return self._answered(body, [a.get("embedding") for a in answers], model, tokens)

    def _answered(
        self, body: dict[str, Any], vectors: list[Any], model: str, tokens: int | None
    ) -> UpstreamResponse:
        try:
            data = render_embeddings(body, vectors, model, tokens)
        except UpstreamProtocolError as exc:
            raise self.http.protocol_error(exc.message) from None
        return UpstreamResponse(200, orjson.dumps(data), data)

    async def count_tokens(self, body: dict[str, Any], headers: Headers | None) -> UpstreamResponse:
        model = str(body.get("model") or "")
        try:
            request = anthropic_messages.parse_request({"max_tokens": 1, **body})
            converse = bedrock_converse.render_request(request, model)
        except FormatError as exc:
            raise self.refusal(exc) from None
        counted = {k: converse[k] for k in ("messages", "system", "toolConfig") if k in converse}
        reply = await self.call_json(
            COUNT_TOKENS_PATH, model, {"input": {"converse": counted}}, headers
        )
        total = reply.data.get("inputTokens")
        if not isinstance(total, int) or isinstance(total, bool) or total < 0:
            raise self.http.protocol_error("answered CountTokens without inputTokens")
        data = TokenCount(input_tokens=total)
        return UpstreamResponse(200, orjson.dumps(data), data)

    async def open_stream(  # type: ignore[override]
        self, path: str, body: dict[str, object], *, headers: Headers | None = None
    ) -> BedrockEventStream:
        url, payload, outbound = await self.prepare(path, body, headers, stream=True)
        outbound = {**outbound, "accept": "application/vnd.amazon.eventstream"}
        response = await self.http.open_response(URL(url, encoded=True), payload, outbound)
        return BedrockEventStream(self.http, response)


class BedrockEventStream:
    """A ConverseStream's events, one JSON object each (``{"contentBlockDelta": {...}}``)."""

    route_note: str | None = None

    def __init__(self, upstream: HttpUpstream, response: aiohttp.ClientResponse) -> None:
        self.upstream = upstream
        self.response = response

    async def batches(self) -> AsyncIterator[list[bytes]]:
        name = self.upstream.provider
        decoder = EventStreamDecoder(self.upstream.settings.max_event_bytes)
        try:
            with self.upstream.reading_stream():
                while chunk := await self.response.content.readany():
                    if messages := decoder.feed(chunk):
                        yield [_as_event(message) for message in messages]
        except EventStreamError as exc:
            self.response.close()
            raise UpstreamError(
                f"upstream provider {name} broke its event stream: {exc}",
                kind="protocol",
                provider=name,
            ) from None
        finally:
            self.response.release()
        if decoder.pending:
            raise UpstreamError(
                f"upstream provider {name} ended its event stream inside a message",
                kind="protocol",
                provider=name,
            )

    def close(self) -> None:
        self.response.close()


def _as_event(message: EventMessage) -> bytes:
    """One event-stream message as the JSON object the Converse stream parser reads."""
    headers = message.headers
    kind = headers.get(":message-type")
    if kind == "event":
        name = headers.get(":event-type")
    elif kind == "exception":
        name = headers.get(":exception-type")
    else:  # an error frame: its code and message are headers
        code = str(headers.get(":error-code") or "internalServerException")
        error = {"message": str(headers.get(":error-message") or code)}
        return orjson.dumps({code[:1].lower() + code[1:]: error})
    if not isinstance(name, str) or not name:
        return orjson.dumps({"internalServerException": {"message": "an unnamed stream event"}})
    try:
        payload = orjson.loads(message.payload) if message.payload else {}
    except orjson.JSONDecodeError:
        payload = {"message": "an event payload that is not JSON"}
    return orjson.dumps({name: payload})
