"""Typed models of the /v1 request fields the gateway itself reads, as msgspec Structs.

Only what routing, limits, token estimation and the relay read is declared here (``model``,
``messages`` with their roles, content parts and tool calls, ``n``/``best_of``, the token caps,
``stream``/``stream_options``, ``tools``/``functions``/``response_format``, ``metadata``,
``user``, ``prompt``, ``input``) plus the sampling numbers the OpenAPI document promises to
check. Every other field is ignored here and forwarded byte-for-byte as the client sent it, so
new OpenAI fields keep working. A message's ``role`` is the tag of a tagged union: a user,
system or developer message must carry content; the others may not. These describe bodies as
the client sends them, in OpenAI's names (``ChatCompletionRequest``); what a chat request means
once parsed is ``gateway.formats.internal.ChatRequest``.

msgspec was chosen over pydantic v2 by measurement (``python -m bench.validation``,
docs/benchmarks.md): the same checks cost 3-5x less per request.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, description="a model or alias of the policy")]
# Refused when true, each door saying why (validation.py); the schema says so too.
NotStreamed = Annotated[bool, msgspec.Meta(extra_json_schema={"enum": [False]})]
TokenCap = Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
Choices = Annotated[int, msgspec.Meta(ge=1, le=128)]
ImageCount = Annotated[int, msgspec.Meta(ge=1, le=10)]
Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
TopP = Annotated[float, msgspec.Meta(ge=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]
# A prompt or embedding input: text, or a non-empty array of texts, token ids or token arrays.
Batch = Annotated[list[str | int | list[int]], msgspec.Meta(min_length=1)]


class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


Content = str | list[ContentPart]


class FunctionCall(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class ChatCompletionToolCall(msgspec.Struct):
    type: str | None = None
    function: FunctionCall | None = None


class _Message(msgspec.Struct, tag_field="role"):
    content: Content | None = None
    name: str | None = None


class SystemMessage(_Message, tag="system"):
    content: Content


class DeveloperMessage(_Message, tag="developer"):
    content: Content


class UserMessage(_Message, tag="user"):
    content: Content


class AssistantMessage(_Message, tag="assistant"):
    tool_calls: list[ChatCompletionToolCall] | None = None
    function_call: FunctionCall | None = None


class ToolMessage(_Message, tag="tool"):
    pass


class FunctionMessage(_Message, tag="function"):
    pass


Message = (
    SystemMessage
    | DeveloperMessage
    | UserMessage
    | AssistantMessage
    | ToolMessage
    | FunctionMessage
)
ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class FunctionDefinition(msgspec.Struct):
    name: NonEmptyStr
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatCompletionTool(msgspec.Struct):
    type: NonEmptyStr
    function: FunctionDefinition | None = None


class JsonSchemaFormat(msgspec.Struct):
    name: NonEmptyStr
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ChatCompletionResponseFormat(msgspec.Struct):
    type: NonEmptyStr
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(msgspec.Struct):
    """Only with stream: true."""

    include_usage: bool | None = None


class Metadata(msgspec.Struct):
    """task_type picks the routing task; other entries pass through."""

    task_type: str | None = None


class _Generation(msgspec.Struct):
    """Fields shared by chat and text completions."""

    model: ModelName | None = None  # none (or "auto") = route by task
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Choices | None = None
    best_of: Choices | None = None
    max_tokens: TokenCap | None = None
    max_completion_tokens: TokenCap | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    metadata: Metadata | None = None


class ChatCompletionRequest(_Generation, kw_only=True):
    """model is optional: without it the policy routes by task."""

    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    tools: list[ChatCompletionTool] | None = None
    functions: list[FunctionDefinition] | None = None
    response_format: ChatCompletionResponseFormat | None = None


class CompletionRequest(_Generation, kw_only=True):
    prompt: str | Batch


class EmbeddingRequest(msgspec.Struct):
    model: ModelName
    input: NonEmptyStr | Batch
    stream: NotStreamed | None = None
    user: str | None = None
    metadata: Metadata | None = None


class ImageRequest(msgspec.Struct):
    model: ModelName
    prompt: NonEmptyStr
    n: ImageCount | None = None
    stream: NotStreamed | None = None
    user: str | None = None
    metadata: Metadata | None = None


class ModerationRequest(msgspec.Struct):
    input: NonEmptyStr | Annotated[list[Any], msgspec.Meta(min_length=1)]
    model: ModelName | None = None  # none (or "auto") = route by task
    metadata: Metadata | None = None


class SpeechRequest(msgspec.Struct):
    model: ModelName
    input: NonEmptyStr
    voice: NonEmptyStr | dict[str, Any]
    response_format: str | None = None
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4)] | None = None
    stream: NotStreamed | None = None
    metadata: Metadata | None = None


class RouteRequest(_Generation):
    """A body ``POST /admin/route/explain`` routes: any /v1 request, every field optional."""

    messages: list[Message] | None = None
    prompt: str | Batch | None = None
    input: NonEmptyStr | Batch | None = None
    tools: list[ChatCompletionTool] | None = None
    functions: list[FunctionDefinition] | None = None
    response_format: ChatCompletionResponseFormat | None = None
