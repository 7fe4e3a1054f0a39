"""The one chat request and response shape that every wire format parses into and renders from.

A front door parses its client's body into a ``ChatRequest``; a provider adapter renders that
into its upstream's format; the upstream's answer is parsed into a ``ChatResponse`` and rendered
back in the client's format. No pair of formats has its own code path.

What the shape does not model travels as data of the format it came from and only to that same
format: ``ChatRequest.extras`` (unmodelled top-level fields), ``Raw`` blocks and tools. Fields
that the source format knows but that would change the answer if dropped are listed in
``ChatRequest.unportable``; rendering into another format refuses them by name.

``path`` on messages and blocks is where the item sat in the client's body
(``messages[3].content[1]``), so that errors raised while rendering still name the client's
field. Tool-call arguments stay JSON text, exactly as the model produced them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# The formats clients speak (each has a front door) and those only upstreams speak: Gemini's
# generateContent and Bedrock's Converse (``formats/gemini``, ``formats/bedrock_converse``).
ClientFormatName = Literal["openai_chat", "anthropic_messages", "openai_responses"]
FormatName = Literal[
    "openai_chat", "anthropic_messages", "openai_responses", "gemini", "bedrock_converse"
]
Role = Literal["user", "assistant", "system"]
StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "refusal",
    "pause_turn",
    "context_window_exceeded",
]
CacheControl = dict[str, Any]


@dataclass(slots=True)
class Text:
    text: str
    cache_control: CacheControl | None = None
    path: str = ""


@dataclass(slots=True)
class Image:
    """An image by URL, by inline base64 data, or by a provider-side file id (``origin`` only)."""

    url: str | None = None
    data: str | None = None
    media_type: str | None = None
    file_id: str | None = None
    detail: str | None = None  # OpenAI's low/high/auto hint
    origin: FormatName | None = None  # the format whose provider owns ``file_id``
    cache_control: CacheControl | None = None
    path: str = ""


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object, as the model wrote it
    cache_control: CacheControl | None = None
    path: str = ""


@dataclass(slots=True)
class ToolResult:
    call_id: str
    content: list[Block] = field(default_factory=list)  # Text, Image or Raw
    is_error: bool = False
    cache_control: CacheControl | None = None
    path: str = ""


@dataclass(slots=True)
class Thinking:
    """Reasoning text. ``signature`` is the producing provider's opaque proof (Anthropic's
    ``signature``, the Responses API's ``encrypted_content``), ``origin`` the upstream format
    that made it (only that provider can verify it), ``item_id`` a Responses item's id."""

    text: str
    signature: str | None = None
    item_id: str | None = None
    origin: FormatName | None = None
    path: str = ""


@dataclass(slots=True)
class RedactedThinking:
    data: str
    path: str = ""


@dataclass(slots=True)
class Refusal:
    text: str
    path: str = ""


@dataclass(slots=True)
class Raw:
    """A block, item or tool the shape does not model, kept verbatim for its own format."""

    format: FormatName
    data: dict[str, Any]
    path: str = ""


Block = Text | Image | ToolCall | ToolResult | Thinking | RedactedThinking | Refusal | Raw


@dataclass(slots=True)
class Message:
    role: Role
    content: list[Block]
    path: str = ""


@dataclass(slots=True)
class Tool:
    """A function tool. ``extras`` are the source format's other tool fields (same format only)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    cache_control: CacheControl | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    path: str = ""


@dataclass(slots=True)
class ToolChoice:
    """auto: the model decides; required: some tool; none: no tool; tool: the one named."""

    mode: Literal["auto", "required", "none", "tool"]
    name: str | None = None


@dataclass(slots=True)
class ResponseFormat:
    kind: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


@dataclass(slots=True)
class Reasoning:
    """How much the model should think. ``effort`` uses OpenAI's and Anthropic's shared words
    (none, minimal, low, medium, high, xhigh, max); ``mode`` and ``budget_tokens`` are Anthropic's
    ``thinking`` (enabled, adaptive, disabled, with its ``display``); ``summary`` is the
    Responses API's."""

    effort: str | None = None
    mode: str | None = None
    budget_tokens: int | None = None
    display: str | None = None
    summary: str | None = None


@dataclass(slots=True)
class ChatRequest:
    model: str
    source: FormatName
    messages: list[Message]
    system: list[Text] = field(default_factory=list)
    tools: list[Tool | Raw] = field(default_factory=list)
    tool_choice: ToolChoice | Raw | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_format: ResponseFormat | None = None
    reasoning: Reasoning | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    stream: bool = False
    include_usage: bool | None = None  # Chat Completions' stream_options.include_usage
    cache_control: CacheControl | None = None  # Anthropic's top-level automatic cache marker
    extras: dict[str, Any] = field(default_factory=dict)
    unportable: dict[str, str] = field(default_factory=dict)  # field path -> why it matters

    def same_format(self, target: FormatName) -> bool:
        return self.source == target

    def field_name(self, name: str) -> str:
        """The client's name for one of this shape's fields, for error messages."""
        return SOURCE_FIELD_NAMES.get((self.source, name), name)


# Where the client's format names a modelled field differently.
SOURCE_FIELD_NAMES: dict[tuple[str, str], str] = {
    ("anthropic_messages", "stop"): "stop_sequences",
    ("anthropic_messages", "response_format"): "output_config.format",
    ("anthropic_messages", "reasoning"): "thinking",
    ("anthropic_messages", "user"): "metadata.user_id",
    ("anthropic_messages", "parallel_tool_calls"): "tool_choice.disable_parallel_tool_use",
    ("openai_chat", "response_format"): "response_format",
    ("openai_chat", "reasoning"): "reasoning_effort",
    ("openai_responses", "max_tokens"): "max_output_tokens",
    ("openai_responses", "response_format"): "text.format",
    ("openai_responses", "system"): "instructions",
}


@dataclass(slots=True)
class Usage:
    """Token counts in one record for every format, so costs stay exact whatever the format.

    ``prompt_tokens`` counts every input token, cache reads and writes included (OpenAI's
    convention; Anthropic's ``input_tokens`` is ``prompt_tokens - cached_tokens -
    cache_write_tokens``). ``completion_tokens`` counts every output token, reasoning included.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def uncached_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens - self.cache_write_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class ChatResponse:
    id: str
    model: str
    content: list[Block]
    stop_reason: StopReason | None
    usage: Usage | None = None
    stop_sequence: str | None = None
    created: int | None = None  # unix seconds, when the source format says
