"""Amazon Bedrock Runtime as a loopback upstream that checks what it receives (see
``native_upstreams``): ``/model/{modelId}/converse`` (JSON) and ``/converse-stream`` (AWS's
binary event stream, ``application/vnd.amazon.eventstream``, CRC-checked frames).

Every request's Signature V4 is recomputed with botocore's own signer (``SigV4Auth``) over
the raw path, the signed headers and the body as received, for the fake's access key, secret,
region and the ``bedrock`` service; a missing, stale or wrong signature is a 403 with the
exception name in ``x-amzn-ErrorType``, as Bedrock answers. Bodies are validated against
botocore's model of the ``Converse`` operation (the service's own shapes), so a field Bedrock
does not know is a 400 ``ValidationException``.

Usage: ``inputTokens`` is ``15 + 3 x messages``; a request with a ``cachePoint`` also reports
30 tokens written to and 40 read from the cache. Model names trigger errors: ``throttled`` (429
``ThrottlingException``), ``ctx-overflow`` (the too-long-input 400), ``stream-throttled`` (a
``throttlingException`` event after the stream's first events).

``/invoke`` embeds as Amazon Titan (``inputText``; ``inputTextTokenCount`` is 2 a word) or Cohere
(``texts``; no count in the body) do, and ``/count-tokens`` counts a Converse request
(``15 + 3 x messages``), its body checked against botocore's model of ``CountTokens``.
"""

from __future__ import annotations

import base64
import calendar
import struct
import time
import zlib
from typing import Any

import orjson
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.session import get_session
from botocore.validate import ParamValidator
from native_upstreams import (
    TOOL_ARGUMENTS,
    NativeUpstream,
    Seen,
    Turn,
    answer_text,
    wants_tool,
)

SERVICE = "bedrock"
MAX_SKEW_S = 300
CACHE_WRITE, CACHE_READ = 30, 40


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string headers, as Bedrock frames them."""
    encoded = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        encoded += bytes([len(raw_name)]) + raw_name + b"\x07"
        encoded += struct.pack(">H", len(raw_value)) + raw_value
    total = 16 + len(encoded) + len(payload)
    prelude = struct.pack(">II", total, len(encoded))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + encoded + payload
    return body + struct.pack(">I", zlib.crc32(body))


def event_frame(event_type: str, payload: dict[str, Any]) -> bytes:
    headers = {
        ":event-type": event_type,
        ":content-type": "application/json",
        ":message-type": "event",
    }
    # Bedrock pads every event with a "p" field of varying length.
    return encode_message(
        headers, orjson.dumps({**payload, "p": "abcdefgh"[: len(event_type) % 8]})
    )


def exception_frame(exception_type: str, message: str) -> bytes:
    headers = {
        ":exception-type": exception_type,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, orjson.dumps({"message": message}))


def converse_turn(body: dict[str, Any]) -> Turn:
    last_text, tool_result, has_image = "", None, False
    messages = body["messages"]
    for message in messages:
        if message["role"] != "user":
            continue
        blocks = message["content"]
        texts = [block["text"] for block in blocks if "text" in block]
        results = [block["toolResult"] for block in blocks if "toolResult" in block]
        has_image = has_image or any("image" in block for block in blocks)
        if results:
            tool_result = " ".join(
                item.get("text", "") for item in results[-1]["content"] if "text" in item
            )
        elif texts:
            tool_result = None
        if texts:
            last_text = " ".join(texts)
    tools = [tool["toolSpec"]["name"] for tool in (body.get("toolConfig") or {}).get("tools", [])]
    cached = any("cachePoint" in block for m in messages for block in m["content"]) or any(
        "cachePoint" in block for block in body.get("system") or []
    )
    return Turn(last_text, tools, tool_result, has_image, cached, len(messages))


class FakeBedrock(NativeUpstream):
    """Bedrock Runtime for the credentials ``access_key``/``secret_key`` in ``region``."""

    def __init__(self, name: str, access_key: str, secret_key: str, region: str) -> None:
        super().__init__(name, access_key)
        self.secret_key = secret_key
        self.region = region
        self._raw_paths: dict[int, str] = {}
        model = get_session().get_service_model("bedrock-runtime")
        self._converse_shape = model.operation_model("Converse").input_shape
        self._stream_shape = model.operation_model("ConverseStream").input_shape

    @property
    def url(self) -> str:
        return self.origin

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/model/{model}/{operation}", self.model_call)

    def refusal(self, seen: Seen) -> str | None:
        return None  # the signature is checked in model_call, where the raw path is known

    def signature_problem(self, request: web.Request, seen: Seen, raw: bytes) -> str | None:
        """Why AWS would refuse this request's Signature V4 (None: it verifies)."""
        authorization = seen.headers.get("authorization", "")
        if not authorization.startswith("AWS4-HMAC-SHA256 "):
            return "Missing Authentication Token"
        fields = dict(
            item.strip().split("=", 1)
            for item in authorization[len("AWS4-HMAC-SHA256 ") :].split(",")
        )
        stamp = seen.headers.get("x-amz-date", "")
        credential = fields.get("Credential", "").split("/")
        if credential[:1] != [self.key]:
            return "The security token included in the request is invalid."
        if credential[1:] != [stamp[:8], self.region, SERVICE, "aws4_request"]:
            return "Credential should be scoped to a valid region and service."
        try:
            signed_at = calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ"))
        except ValueError:
            return "X-Amz-Date is missing or malformed"
        if abs(signed_at - time.time()) > MAX_SKEW_S:
            return "Signature expired"
        signed_names = fields.get("SignedHeaders", "").split(";")
        if "host" not in signed_names or "x-amz-date" not in signed_names:
            return "host and x-amz-date must be signed"
        headers = {name: seen.headers[name] for name in signed_names if name in seen.headers}
        aws = AWSRequest(
            method=request.method,
            url=f"http://{seen.headers['host']}{request.raw_path}",
            data=raw,
            headers=headers,
        )
        aws.context["timestamp"] = stamp
        signer = SigV4Auth(Credentials(self.key, self.secret_key), SERVICE, self.region)
        expected = signer.signature(signer.string_to_sign(aws, signer.canonical_request(aws)), aws)
        if fields.get("Signature") != expected:
            return "The request signature we calculated does not match the signature you provided."
        return None

    @staticmethod
    def aws_error(status: int, error_type: str, message: str) -> web.Response:
        return web.json_response(
            {"message": message},
            status=status,
            headers={
                "x-amzn-ErrorType": f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"
            },
        )

    def validation_problem(self, body: Any, model: str, stream: bool) -> str | None:
        """What botocore's model of Converse says of the body (images as their bytes)."""
        if not isinstance(body, dict):
            return "the body is not a JSON object"
        params = orjson.loads(orjson.dumps(body))
        for message in params.get("messages", []):
            for block in message.get("content", []):
                source = block.get("image", {}).get("source", {}) if isinstance(block, dict) else {}
                if "bytes" in source:
                    source["bytes"] = base64.b64decode(source["bytes"])
        shape = self._stream_shape if stream else self._converse_shape
        report = ParamValidator().validate({**params, "modelId": model}, shape)
        return report.generate_report() if report.has_errors() else None

    async def model_call(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        seen, refused = await self._receive_raw(request, raw)
        if refused:
            return self.aws_error(403, "UnrecognizedClientException", refused)
        problem = self.signature_problem(request, seen, raw)
        if problem:
            return self.aws_error(403, "InvalidSignatureException", problem)
        model = request.match_info["model"]  # percent-decoded, as Bedrock reads the id
        operation = request.match_info["operation"]
        if operation == "invoke":
            return self.invoke(seen.body, model)
        if operation == "count-tokens":
            return self.count_tokens(seen.body, model)
        if operation not in ("converse", "converse-stream"):
            return self.aws_error(404, "UnknownOperationException", operation)
        stream = operation == "converse-stream"
        problem = self.validation_problem(seen.body, model, stream)
        if problem:
            return self.aws_error(400, "ValidationException", problem)
        if model.startswith("throttled"):
            return self.aws_error(
                429, "ThrottlingException", "Too many requests, please wait before trying again."
            )
        if "ctx-overflow" in model:
            return self.aws_error(
                400, "ValidationException", "Input is too long for requested model."
            )
        return await self.converse(request, seen.body, model, stream)

    def invoke(self, body: Any, model: str) -> web.Response:
        if "titan-embed" in model:
            if not isinstance(body, dict) or set(body) - {"inputText", "dimensions", "normalize"}:
                return self.aws_error(400, "ValidationException", "malformed Titan input")
            text = body["inputText"]
            count = 2 * len(text.split())
            self._book(model, count, 0, 0, 0)
            vector = [float(len(text)), 0.25, 0.5][: body.get("dimensions", 3)]
            return web.json_response({"embedding": vector, "inputTextTokenCount": count})
        if "cohere.embed" in model:
            if not isinstance(body, dict) or "texts" not in body or "input_type" not in body:
                return self.aws_error(400, "ValidationException", "malformed Cohere input")
            self._book(model, 0, 0, 0, 0)
            vectors = [[float(len(text)), 0.75] for text in body["texts"]]
            return web.json_response(
                {
                    "id": "e1",
                    "embeddings": vectors,
                    "texts": body["texts"],
                    "response_type": "embeddings_floats",
                }
            )
        return self.aws_error(400, "ValidationException", f"{model} does not embed here")

    def count_tokens(self, body: Any, model: str) -> web.Response:
        shape = get_session().get_service_model("bedrock-runtime").operation_model("CountTokens")
        report = ParamValidator().validate({**body, "modelId": model}, shape.input_shape)
        if report.has_errors():
            return self.aws_error(400, "ValidationException", report.generate_report())
        self._book(f"count:{model}", 0, 0, 0, 0)
        return web.json_response(
            {"inputTokens": 15 + 3 * len(body["input"]["converse"]["messages"])}
        )

    async def _receive_raw(self, request: web.Request, raw: bytes) -> tuple[Seen, str | None]:
        headers = {key.lower(): value for key, value in request.headers.items()}
        body: Any = orjson.loads(raw) if raw else None
        seen = Seen(request.path, dict(request.query), headers, body)
        with self._lock:
            self._seen.append(seen)
        for name, value in headers.items():
            if "sk-sy-" in value:
                return seen, f"a client credential reached the upstream in {name}"
        return seen, None

    async def converse(
        self, request: web.Request, body: dict[str, Any], model: str, stream: bool
    ) -> web.StreamResponse:
        turn = converse_turn(body)
        call = wants_tool(turn)
        text = "" if call else answer_text(self.name, turn)
        uncached = 15 + 3 * turn.messages
        written, read = (CACHE_WRITE, CACHE_READ) if turn.cache_marked else (0, 0)
        output = max(len(text.split()), 1)
        self._book(model, uncached + written + read, output, read, written)
        usage = {
            "inputTokens": uncached,
            "outputTokens": output,
            "totalTokens": uncached + output + read + written,
        }
        if turn.cache_marked:
            usage.update({"cacheReadInputTokens": read, "cacheWriteInputTokens": written})
        stop = "tool_use" if call else "end_turn"
        if call:
            block: dict[str, Any] = {
                "toolUse": {
                    "toolUseId": "tooluse_1",
                    "name": turn.tool_names[0],
                    "input": TOOL_ARGUMENTS,
                }
            }
        else:
            block = {"text": text}
        if not stream:
            return web.json_response(
                {
                    "output": {"message": {"role": "assistant", "content": [block]}},
                    "stopReason": stop,
                    "usage": usage,
                    "metrics": {"latencyMs": 12},
                }
            )
        frames = [event_frame("messageStart", {"role": "assistant"})]
        if call:
            use = block["toolUse"]
            start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
            frames.append(
                event_frame("contentBlockStart", {"contentBlockIndex": 0, "start": start})
            )
            arguments = orjson.dumps(TOOL_ARGUMENTS).decode()
            for piece in (arguments[:5], arguments[5:]):
                delta = {"toolUse": {"input": piece}}
                frames.append(
                    event_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": delta})
                )
        else:
            for index, word in enumerate(text.split(" ")):
                delta = {"text": word if index == 0 else " " + word}
                frames.append(
                    event_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": delta})
                )
        if model.startswith("stream-throttled"):
            frames.append(exception_frame("throttlingException", "Rate exceeded."))
        else:
            frames.append(event_frame("contentBlockStop", {"contentBlockIndex": 0}))
            frames.append(event_frame("messageStop", {"stopReason": stop}))
            frames.append(event_frame("metadata", {"usage": usage, "metrics": {"latencyMs": 12}}))
        response = web.StreamResponse(
            headers={"Content-Type": "application/vnd.amazon.eventstream"}
        )
        await response.prepare(request)
        wire = b"".join(frames)
        for start in range(0, len(wire), 37):  # frames split anywhere, as a network delivers
            await response.write(wire[start : start + 37])
        await response.write_eof()
        return response
