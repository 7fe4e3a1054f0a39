"""A chat request's conversation, in the internal form ``formats/`` parsed it into, as the turns
a chat template takes (HF's ``messages``: role and text content, an assistant's
``tool_calls``, ``tool`` turns).

Each turn's text is its text blocks joined; the system prompt is a turn per system message the
client sent. A template that renders tools itself gets the calls and results as HF passes them
(arguments as objects, a ``tool`` turn named after its call); any other gets them written in
the tool parser's syntax, results as ``<tool_response>`` user turns, and the generic tool
prompt in its system turn. The local model reads text only: an image or another part is a 400
naming where it sat; what no Chat Completions body could carry (another format's own items)
is refused as a translation refuses it, so the next candidate may take it.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.formats.errors import Untranslatable
from gateway.formats.internal import (
    Block,
    ChatRequest,
    Image,
    Message,
    Raw,
    RedactedThinking,
    Refusal,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
)
from gateway.formats.portability import TITLES, raw_data
from gateway.providers.base import refused_request
from gateway.providers.local_errors import client_error
from gateway.providers.local_tools import ToolPlan, renders_tools
from gateway.providers.tool_parsers import ToolParser, make_parser

# The format whose bodies the local model's requests read like.
_AS = "openai_chat"


def chat_turns(
    provider: str, request: ChatRequest, plan: ToolPlan | None, template: str | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The template's messages and its extra variables (``tools``), for a template that
    renders tools or with the generic tool prompt."""
    native = renders_tools(template)
    parser = plan.parser if plan is not None else make_parser("hermes", frozenset())
    turns = [{"role": "system", "content": text} for text in _system_prompt(request)]
    names: dict[str, str] = {}  # tool call id -> function name, for the tool turns
    for message in request.messages:
        if message.role == "assistant":
            turns.append(_assistant(provider, message, native, parser, names))
        elif message.role == "system":
            turns.append({"role": "system", "content": _text(provider, message.content, message)})
        else:
            turns.extend(_user(provider, message, native, names))
    if plan is None:
        return turns, {}
    if native:
        return turns, {"tools": plan.template_tools()}
    block = plan.prompt_block()
    if turns and turns[0]["role"] == "system":
        first = turns[0]["content"]
        turns[0] = {"role": "system", "content": f"{first}\n\n{block}" if first else block}
    else:
        turns.insert(0, {"role": "system", "content": block})
    return turns, {}


def _system_prompt(request: ChatRequest) -> list[str]:
    """The system prompt's turns: one per system message a Chat Completions client sent (its
    texts' paths say which), else one."""
    if not request.system:
        return []
    if not request.same_format(_AS):
        return ["".join(text.text for text in request.system)]
    turns: dict[str, list[str]] = {}
    for text in request.system:
        turns.setdefault(text.path.split(".", 1)[0], []).append(text.text)
    return ["".join(texts) for texts in turns.values()]


def _text(provider: str, blocks: list[Block], within: Message | ToolResult) -> str:
    texts = []
    for block in blocks:
        if not isinstance(block, Text):
            _refuse(provider, block, within.path)
        texts.append(block.text)
    return "".join(texts)


def _refuse(provider: str, block: Block, path: str) -> None:
    """A part the local model cannot read: another format's own item as a translation
    refuses it, anything else as a 400 naming where it sat."""
    if isinstance(block, Raw) and block.format != _AS:
        try:
            raw_data(block, _AS, path)
        except Untranslatable as exc:
            raise refused_request(exc, provider, "untranslatable") from None
    where = block.path or path
    raise client_error(provider, f"{where}: the local model accepts text parts only", where)


def _user(
    provider: str, message: Message, native: bool, names: dict[str, str]
) -> list[dict[str, Any]]:
    """A user message: its tool results first (a turn each, as Chat Completions has them),
    then its text."""
    turns: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in message.content:
        if isinstance(block, ToolResult):
            turns.append(_tool_result(provider, block, native, names))
        elif isinstance(block, Text):
            texts.append(block.text)
        else:
            _refuse(provider, block, message.path)
    if texts or not turns:
        turns.append({"role": "user", "content": "".join(texts)})
    return turns


def _tool_result(
    provider: str, result: ToolResult, native: bool, names: dict[str, str]
) -> dict[str, Any]:
    for block in result.content:
        if not isinstance(block, Text):
            raise refused_request(
                Untranslatable(
                    block.path or result.path, TITLES[_AS], "tool results carry only text there"
                ),
                provider,
                "untranslatable",
            )
    text = "".join(block.text for block in result.content if isinstance(block, Text))
    if not native:
        return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}
    turn = {"role": "tool", "content": text, "tool_call_id": result.call_id}
    if result.call_id in names:
        turn["name"] = names[result.call_id]
    return turn


def _assistant(
    provider: str, message: Message, native: bool, parser: ToolParser, names: dict[str, str]
) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, Text):
            texts.append(block.text)
        elif isinstance(block, ToolCall):
            calls.append(_call(provider, block))
            names[block.id] = block.name
        elif isinstance(block, Raw) and block.format == _AS:
            if "type" in block.data:  # a tool call of another kind than a function
                param = f"{block.path}.function.name"
                raise client_error(provider, f"{param} must be a string", param)
            # a legacy function_call or an audio reference: the model reads neither
        elif isinstance(block, Raw):
            _refuse(provider, block, message.path)
        elif not isinstance(block, Thinking | RedactedThinking | Refusal):
            kind = "images" if isinstance(block, Image) else "tool results"
            why = f"assistant messages cannot carry {kind}"
            exc = Untranslatable(block.path or message.path, TITLES[_AS], why)
            raise refused_request(exc, provider, "untranslatable")
    text = "".join(texts)
    if not calls:
        return {"role": "assistant", "content": text}
    if native:
        return {"role": "assistant", "content": text, "tool_calls": calls}
    written = [
        parser.render_call(c["function"]["name"], json.dumps(c["function"]["arguments"]))
        for c in calls
    ]
    return {"role": "assistant", "content": "\n".join([text, *written] if text else written)}


def _call(provider: str, call: ToolCall) -> dict[str, Any]:
    """A past call with its arguments as an object (HF templates' shape)."""
    param = f"{call.path}.function.arguments"
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise client_error(provider, f"{param} must be a JSON object's text", param)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }
