"""Google's Gemini API and Vertex AI as loopback upstreams that check what they receive (see
``native_upstreams``).

``FakeGemini`` serves ``/v1beta/models/{model}:generateContent`` and
``:streamGenerateContent?alt=sse`` (server-sent events, ``\\r\\n`` line ends as Google sends
them) and checks its API key in ``x-goog-api-key`` the way the Gemini API does: a wrong key is
a 400 ``INVALID_ARGUMENT`` whose details say ``API_KEY_INVALID``, a missing one a 403. Bodies
are read as strictly as Google's JSON parser reads them: an unknown field anywhere is a 400
naming it, and so is a role other than ``user`` and ``model``; as Gemini 3 does, the first
function call of each model turn must carry a thought signature (the one the fake gave, or
Google's placeholder for calls of another model).

``FakeVertex`` is Vertex AI with its own OAuth token endpoint (``/token``): a service account
posts a JWT assertion, the fake verifies its RS256 signature with the public half of the test
key (``service_account_key()``), its issuer, audience (Google's token endpoint), scope and
lifetime, and answers with an
access token; every Vertex call must carry a token it issued that has not expired. It serves
Gemini models at ``/v1/projects/{p}/locations/{l}/publishers/google/models/{m}:...`` and
Claude at ``.../publishers/anthropic/models/{m}:rawPredict`` and ``:streamRawPredict`` (the
Messages format with ``anthropic_version: vertex-2023-10-16`` and no ``model`` in the body).

Both embed (``:batchEmbedContents`` at the Gemini API, answering no token count as Google does;
``:predict`` at Vertex, whose statistics count 2 tokens a word) and count tokens
(``:countTokens``: ``12 + 4 x turns``, the prompt count of generateContent).

Usage: the prompt counts ``12 + 4 x turns`` tokens, of which 8 are an implicit cache hit when
there is a system instruction; the answer counts one token a word plus 3 thinking tokens.
Model names trigger errors: ``ctx-overflow`` (the context-window 400), ``exhausted`` (429
``RESOURCE_EXHAUSTED``).
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from typing import Any

import orjson
from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from native_anthropic import FakeAnthropic
from native_upstreams import (
    TOOL_ARGUMENTS,
    NativeUpstream,
    Seen,
    Turn,
    answer_text,
    wants_tool,
)

VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
CLOUD_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# The audience of a service account's assertion is Google's token endpoint, wherever the
# assertion is posted (google-auth writes it so, and Google checks it).
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
PROMPT_BASE, PROMPT_PER_TURN, IMPLICIT_CACHE, THOUGHTS = 12, 4, 8, 3
# The proof the fake signs its function calls with, and the placeholder Google documents for
# calls no Gemini model made (a history from another provider).
CALL_SIGNATURE = "c2lnbmVkLWJ5LWdlbWluaQ=="
ACCEPTED_SIGNATURES = (CALL_SIGNATURE, "context_engineering_is_the_way_to_go")

# Google's JSON parser refuses unknown fields: the fields of each object the fake reads.
_FIELDS: dict[str, frozenset[str]] = {
    "request": frozenset(
        {
            "contents",
            "systemInstruction",
            "tools",
            "toolConfig",
            "generationConfig",
            "safetySettings",
            "cachedContent",
            "labels",
        }
    ),
    "content": frozenset({"role", "parts"}),
    "part": frozenset(
        {
            "text",
            "inlineData",
            "fileData",
            "functionCall",
            "functionResponse",
            "thought",
            "thoughtSignature",
            "executableCode",
            "codeExecutionResult",
        }
    ),
    "inlineData": frozenset({"mimeType", "data"}),
    "fileData": frozenset({"mimeType", "fileUri"}),
    "functionCall": frozenset({"id", "name", "args"}),
    "functionResponse": frozenset({"id", "name", "response"}),
    "tool": frozenset({"functionDeclarations", "googleSearch", "codeExecution"}),
    "functionDeclaration": frozenset(
        {"name", "description", "parameters", "parametersJsonSchema", "response"}
    ),
    "toolConfig": frozenset({"functionCallingConfig"}),
    "functionCallingConfig": frozenset({"mode", "allowedFunctionNames"}),
    "generationConfig": frozenset(
        {
            "maxOutputTokens",
            "temperature",
            "topP",
            "topK",
            "stopSequences",
            "candidateCount",
            "seed",
            "presencePenalty",
            "frequencyPenalty",
            "responseMimeType",
            "responseSchema",
            "responseJsonSchema",
            "thinkingConfig",
        }
    ),
    "thinkingConfig": frozenset({"thinkingBudget", "includeThoughts", "thinkingLevel"}),
}


def _unknown(kind: str, value: Any, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"Invalid value at '{where}': expected an object"
    for key in value:
        if key not in _FIELDS[kind]:
            return f"Invalid JSON payload received. Unknown name \"{key}\" at '{where}'"
    return None


def check_generate_request(body: Any) -> str | None:
    """Why Gemini would refuse this generateContent body (None: it reads it)."""
    problem = _unknown("request", body, "")
    if problem:
        return problem
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    for i, content in enumerate(contents):
        problem = _unknown("content", content, f"contents[{i}]")
        if problem:
            return problem
        if content.get("role") not in ("user", "model"):
            return f"Please use a valid role: user, model. (contents[{i}].role)"
        calls = [p for p in content.get("parts") or [] if "functionCall" in p]
        if calls and calls[0].get("thoughtSignature") not in ACCEPTED_SIGNATURES:
            # Gemini 3 checks the proof of the first function call of each model turn.
            return f"Function call is missing a thought_signature in contents[{i}]"
        for j, part in enumerate(content.get("parts") or []):
            where = f"contents[{i}].parts[{j}]"
            problem = _unknown("part", part, where)
            for key in ("inlineData", "fileData", "functionCall", "functionResponse"):
                if not problem and key in part:
                    problem = _unknown(key, part[key], f"{where}.{key}")
            if problem:
                return problem
    system = body.get("systemInstruction")
    if system is not None:
        problem = _unknown("content", system, "system_instruction")
        if problem:
            return problem
    for i, tool in enumerate(body.get("tools") or []):
        problem = _unknown("tool", tool, f"tools[{i}]")
        for j, declaration in enumerate(tool.get("functionDeclarations") or []):
            where = f"tools[{i}].function_declarations[{j}]"
            problem = problem or _unknown("functionDeclaration", declaration, where)
        if problem:
            return problem
    config = body.get("toolConfig")
    if config is not None:
        problem = _unknown("toolConfig", config, "tool_config") or _unknown(
            "functionCallingConfig", config.get("functionCallingConfig", {}), "tool_config"
        )
        if problem:
            return problem
    generation = body.get("generationConfig")
    if generation is not None:
        problem = _unknown("generationConfig", generation, "generation_config")
        if not problem and "thinkingConfig" in generation:
            problem = _unknown("thinkingConfig", generation["thinkingConfig"], "thinking_config")
        if problem:
            return problem
    return None


def gemini_turn(body: dict[str, Any]) -> Turn:
    last_text, tool_result, has_image = "", None, False
    contents = body["contents"]
    for content in contents:
        if content["role"] != "user":
            continue
        parts = content.get("parts") or []
        texts = [part["text"] for part in parts if "text" in part]
        results = [part["functionResponse"] for part in parts if "functionResponse" in part]
        has_image = has_image or any("inlineData" in p or "fileData" in p for p in parts)
        if results:
            tool_result = orjson.dumps(results[-1]["response"]).decode()
        elif texts:
            tool_result = None
        if texts:
            last_text = " ".join(texts)
    tools = [
        declaration["name"]
        for tool in body.get("tools") or []
        for declaration in tool.get("functionDeclarations") or []
    ]
    return Turn(last_text, tools, tool_result, has_image, False, len(contents))


def google_error(status: int, code_name: str, message: str, **extra: Any) -> web.Response:
    error = {"code": status, "message": message, "status": code_name, **extra}
    return web.json_response({"error": error}, status=status)


def vector(text: str) -> list[float]:
    """A made-up embedding that tells the texts apart."""
    return [float(len(text)), float(sum(map(ord, text)) % 97), 0.5]


class GeminiAnswers(NativeUpstream):
    """The generateContent answers the Gemini API and Vertex AI share."""

    def count_tokens(self, request_body: Any, model: str) -> web.Response:
        problem = check_generate_request(request_body)
        if problem:
            return google_error(400, "INVALID_ARGUMENT", problem)
        self._book(f"count:{model}", 0, 0, 0, 0)
        prompt = PROMPT_BASE + PROMPT_PER_TURN * len(request_body["contents"])
        return web.json_response({"totalTokens": prompt})

    async def generate(self, request: web.Request, seen: Seen, model: str, method: str):
        if method not in ("generateContent", "streamGenerateContent"):
            return google_error(404, "NOT_FOUND", f"method {method} is not served here")
        body = seen.body
        problem = check_generate_request(body)
        if problem:
            return google_error(400, "INVALID_ARGUMENT", problem)
        if "ctx-overflow" in model:
            return google_error(
                400,
                "INVALID_ARGUMENT",
                "The input token count (900) exceeds the maximum number of tokens allowed (16).",
            )
        if "exhausted" in model:
            return google_error(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted.")
        turn = gemini_turn(body)
        call = wants_tool(turn)
        text = "" if call else answer_text(self.name, turn)
        prompt = PROMPT_BASE + PROMPT_PER_TURN * turn.messages
        cached = IMPLICIT_CACHE if body.get("systemInstruction") else 0
        words = max(len(text.split()), 1)
        self._book(model, prompt, words + THOUGHTS, cached, 0)
        usage = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": words,
            "thoughtsTokenCount": THOUGHTS,
            "totalTokenCount": prompt + words + THOUGHTS,
        }
        if cached:
            usage["cachedContentTokenCount"] = cached
        if call:
            parts: list[dict[str, Any]] = [
                {
                    "functionCall": {"name": turn.tool_names[0], "args": TOOL_ARGUMENTS},
                    "thoughtSignature": CALL_SIGNATURE,
                }
            ]
        else:
            parts = [{"text": text}]
        answer = {
            "candidates": [
                {
                    "content": {"role": "model", "parts": parts},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": f"resp-{self.name}",
        }
        if method == "generateContent":
            return web.json_response(answer)
        if request.query.get("alt") != "sse":
            return google_error(400, "INVALID_ARGUMENT", "this fake streams only with alt=sse")
        chunks: list[dict[str, Any]] = []
        running = {"promptTokenCount": prompt, "totalTokenCount": prompt}
        if call:
            chunks.append({"candidates": [{"content": {"role": "model", "parts": parts}}]})
        else:
            words_list = text.split(" ")
            for index, word in enumerate(words_list):
                piece = word if index == 0 else " " + word
                chunks.append(
                    {
                        "candidates": [
                            {"content": {"role": "model", "parts": [{"text": piece}]}, "index": 0}
                        ],
                        "usageMetadata": running,
                    }
                )
        chunks.append(
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": [{"text": ""}]},
                        "finishReason": "STOP",
                        "index": 0,
                    }
                ],
                "usageMetadata": usage,
            }
        )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            data = {**chunk, "modelVersion": model, "responseId": f"resp-{self.name}"}
            await response.write(b"data: " + orjson.dumps(data) + b"\r\n\r\n")
        await response.write_eof()
        return response


class FakeGemini(GeminiAnswers):
    """The Gemini API (``/v1beta``) with its API key in ``x-goog-api-key``."""

    @property
    def url(self) -> str:
        return self.origin + "/v1beta"

    def refusal(self, seen: Seen) -> str | None:
        given = seen.headers.get("x-goog-api-key")
        if given is None:
            return "missing"
        if given != self.key:
            return "invalid"
        if "authorization" in seen.headers:
            return "invalid"
        return None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1beta/models/{call}", self.model_call)

    async def model_call(self, request: web.Request) -> web.StreamResponse:
        seen, refused = await self._receive(request)
        if refused == "missing":
            return google_error(
                403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers."
            )
        if refused:
            details = [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                }
            ]
            return google_error(
                400,
                "INVALID_ARGUMENT",
                "API key not valid. Please pass a valid API key.",
                details=details,
            )
        model, _, method = request.match_info["call"].partition(":")
        body = seen.body
        if method == "countTokens":
            inner = body.get("generateContentRequest") if isinstance(body, dict) else None
            if not isinstance(inner, dict) or inner.get("model") != f"models/{model}":
                return google_error(400, "INVALID_ARGUMENT", "generateContentRequest.model")
            return self.count_tokens({k: v for k, v in inner.items() if k != "model"}, model)
        if method == "batchEmbedContents":
            return self.batch_embed(body, model)
        return await self.generate(request, seen, model, method)

    def batch_embed(self, body: Any, model: str) -> web.Response:
        requests = body.get("requests") if isinstance(body, dict) else None
        if set(body) != {"requests"} or not isinstance(requests, list) or not requests:
            return google_error(400, "INVALID_ARGUMENT", "requests is required")
        vectors = []
        for index, item in enumerate(requests):
            if set(item) - {"model", "content", "outputDimensionality", "taskType"}:
                return google_error(400, "INVALID_ARGUMENT", f"Unknown name at requests[{index}]")
            if item.get("model") != f"models/{model}":
                return google_error(400, "INVALID_ARGUMENT", "the requests' model must match")
            text = " ".join(p.get("text", "") for p in item["content"]["parts"])
            vectors.append({"values": vector(text)[: item.get("outputDimensionality", 3)]})
        self._book(model, 0, 0, 0, 0)
        return web.json_response({"embeddings": vectors})


def service_account_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def service_account_json(key: rsa.RSAPrivateKey, token_uri: str) -> dict[str, str]:
    """A service-account key file as Google issues them, its token_uri on the fake."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {
        "type": "service_account",
        "project_id": "switchyard-test",
        "private_key_id": "0123456789abcdef",
        "private_key": pem,
        "client_email": "gateway@switchyard-test.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": token_uri,
    }


def _b64(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


class FakeVertex(GeminiAnswers, FakeAnthropic):
    """Vertex AI (``/v1/projects/...``) and its OAuth token endpoint (``/token``)."""

    def __init__(self, name: str, key: rsa.RSAPrivateKey, token_lifetime_s: int = 3600) -> None:
        FakeAnthropic.__init__(self, name, "", VERTEX_ANTHROPIC_VERSION)
        self.public_key = key.public_key()
        self.client_email = "gateway@switchyard-test.iam.gserviceaccount.com"
        self.token_lifetime_s = token_lifetime_s
        self._tokens: dict[str, float] = {}  # access token -> expiry (epoch seconds)
        self._token_lock = threading.Lock()
        self.assertions: list[dict[str, Any]] = []  # the verified JWT claims, in order

    @property
    def token_uri(self) -> str:
        return self.origin + "/token"

    @property
    def url(self) -> str:
        return self.origin + "/v1"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/token", self.token)
        app.router.add_post(
            "/v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{call}",
            self.model_call,
        )

    def refusal(self, seen: Seen) -> str | None:
        header = seen.headers.get("authorization", "")
        token = header.removeprefix("Bearer ")
        with self._token_lock:
            expiry = self._tokens.get(token)
        if not header.startswith("Bearer ") or expiry is None:
            return "Request had invalid authentication credentials."
        if expiry <= time.time():
            return "Request had invalid authentication credentials (expired)."
        if "x-api-key" in seen.headers or "x-goog-api-key" in seen.headers:
            return "an API key reached Vertex"
        return None

    def issued(self, token: str) -> bool:
        """Whether the token endpoint minted ``token``."""
        with self._token_lock:
            return token in self._tokens

    def verify_assertion(self, assertion: str) -> dict[str, Any] | None:
        """The JWT's claims when Google would accept it: RS256 by the key, for this endpoint."""
        try:
            header_b64, claims_b64, signature_b64 = assertion.split(".")
            header = json.loads(_b64(header_b64))
            claims = json.loads(_b64(claims_b64))
            self.public_key.verify(
                _b64(signature_b64),
                f"{header_b64}.{claims_b64}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
        except Exception:
            return None
        now = time.time()
        valid = (
            header.get("alg") == "RS256"
            and claims.get("iss") == self.client_email
            and claims.get("aud") == GOOGLE_TOKEN_AUDIENCE
            and CLOUD_SCOPE in str(claims.get("scope", "")).split()
            and claims.get("iat", now + 999) <= now + 60
            and now < claims.get("exp", 0) <= claims.get("iat", 0) + 3600
        )
        return claims if valid else None

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != JWT_BEARER:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        claims = self.verify_assertion(str(form.get("assertion", "")))
        if claims is None:
            return web.json_response(
                {"error": "invalid_grant", "error_description": "Invalid JWT Signature."},
                status=400,
            )
        token = "ya29." + secrets.token_urlsafe(24)
        with self._token_lock:
            self._tokens[token] = time.time() + self.token_lifetime_s
            self.assertions.append(claims)
        return web.json_response(
            {"access_token": token, "expires_in": self.token_lifetime_s, "token_type": "Bearer"}
        )

    async def model_call(self, request: web.Request) -> web.StreamResponse:
        seen, refused = await self._receive(request)
        if refused:
            return google_error(401, "UNAUTHENTICATED", refused)
        model, _, method = request.match_info["call"].partition(":")
        if request.match_info["publisher"] == "google":
            if method == "countTokens":
                return self.count_tokens(seen.body, model)
            if method == "predict":
                return self.predict(seen.body, model)
            return await self.generate(request, seen, model, method)
        if request.match_info["publisher"] != "anthropic":
            return google_error(404, "NOT_FOUND", "unknown publisher")
        body = seen.body
        if model == "count-tokens":
            return web.json_response({"input_tokens": 10 + 3 * len(body["messages"])})
        if "model" in body:
            return self.error(400, "invalid_request_error", "model: Extra inputs are not permitted")
        if body.get("anthropic_version") != VERTEX_ANTHROPIC_VERSION:
            return self.error(400, "invalid_request_error", "anthropic_version is required")
        stream = method == "streamRawPredict"
        if stream != bool(body.get("stream")) or method not in ("rawPredict", "streamRawPredict"):
            return self.error(400, "invalid_request_error", "stream does not match the method")
        request_body = {k: v for k, v in body.items() if k != "anthropic_version"}
        return await self.answer(request, {**request_body, "model": model})

    def predict(self, body: Any, model: str) -> web.Response:
        """Vertex's text embeddings: ``instances`` of ``content``; statistics count tokens."""
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or not instances:
            return google_error(400, "INVALID_ARGUMENT", "instances is required")
        size = (body.get("parameters") or {}).get("outputDimensionality", 3)
        predictions, tokens = [], 0
        for instance in instances:
            count = 2 * len(instance["content"].split())
            tokens += count
            statistics = {"truncated": False, "token_count": count}
            values = vector(instance["content"])[:size]
            predictions.append({"embeddings": {"values": values, "statistics": statistics}})
        self._book(model, tokens, 0, 0, 0)
        return web.json_response({"predictions": predictions})
