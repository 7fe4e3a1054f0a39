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
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from urllib.parse import quote

import aiohttp
import orjson
from yarl import URL

from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.formats import bedrock_converse
from gateway.formats.errors import ErrorInfo
from gateway.providers.aws_eventstream import EventMessage, EventStreamDecoder, EventStreamError
from gateway.providers.aws_sigv4 import AwsCredentialSource, missing_botocore, sign_v4
from gateway.providers.base import Headers
from gateway.providers.cloud_http import CloudHttpProvider
from gateway.providers.http_upstream import HttpUpstream, UpstreamSettings
from gateway.routing.policy import ProviderConfig

CHAT_PATH = "/converse"


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

    def serves(self, path: str) -> bool:
        return path == CHAT_PATH

    def endpoint(self, path: str, model: str, *, stream: bool) -> str:
        operation = "converse-stream" if stream else "converse"
        return f"{self.base_url}/model/{quote(model, safe='')}/{operation}"

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {}  # every request is signed (authorize)

    async def authorize(self, url: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        credentials = await self.credentials.current()
        signed = sign_v4(credentials, self.region, "POST", url, {"content-type": JSON}, body)
        return {**headers, **signed}

    def read_error(self, status: int, body: bytes) -> ErrorInfo:
        return bedrock_converse.parse_error(status, body)

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

    async def events(self) -> AsyncIterator[bytes]:
        name = self.upstream.provider
        decoder = EventStreamDecoder(self.upstream.limits.max_event_bytes)
        try:
            while True:
                chunk = await self.response.content.readany()
                if not chunk:
                    break
                for message in decoder.feed(chunk):
                    yield _as_event(message)
        except EventStreamError as exc:
            self.response.close()
            raise UpstreamError(
                f"upstream provider {name} broke its event stream: {exc}",
                kind="protocol",
                provider=name,
            ) from None
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise UpstreamTimeout(
                f"upstream provider {name} stopped sending mid-stream", provider=name
            ) from None
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise UpstreamError(
                f"upstream provider {name} broke the stream ({type(exc).__name__})",
                kind="protocol",
                provider=name,
            ) from exc
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
