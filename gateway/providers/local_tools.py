"""Tool calling on the local engine: ``tools``/``tool_choice``/``parallel_tool_calls`` read into
a ``ToolPlan``, the conversation's calls and results rendered, and the grammar of a forced call.

The prompt: a chat template that renders ``tools`` (its text names them, as Qwen's, Hermes' and
Llama 3.1's do) gets them and the ``tool_calls``/``role: tool`` turns as HF passes them. Any
other template (SmolLM2's) gets the generic tool prompt (``GENERIC_TOOL_PROMPT``) in its system
turn, past calls written in the parser's syntax and results as ``<tool_response>`` user turns.

``tool_choice``: ``none`` offers no tools and parses nothing; ``auto`` lets the model choose
(a malformed call stays text); ``required`` and a named function are guaranteed by the grammar
(the parser's ``call_format``: a call to an offered function whose arguments match its schema;
exactly one with ``parallel_tool_calls: false`` or a named function). Every offered function's
``parameters`` schema is compiled (cached), so one xgrammar cannot compile is a 400 naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.providers.local_errors import client_error
from gateway.providers.tool_parsers import PARSERS, ToolParser, make_parser

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

GENERIC_TOOL_PROMPT = """\
# Tools

You can call functions to help with the request. Each one is a JSON object of its name, \
description and the JSON schema of its arguments, inside <tools></tools> tags:
<tools>
{functions}
</tools>

{convention}
The results of calls come back inside <tool_response></tool_response> tags."""


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict[str, Any]
    index: int  # in the body's tools: names the param of a schema that cannot compile


@dataclass(frozen=True)
class ToolPlan:
    functions: tuple[Function, ...]
    choice: str  # auto | required | named
    named: str | None
    parallel: bool
    parser: ToolParser

    def grammar(self) -> Any:
        """The ``StructuredOutput`` that forces a call (``required``/named), else None."""
        from engine import StructuredOutput

        if self.choice == "auto":
            return None
        offered = [f for f in self.functions if self.named in (None, f.name)]
        schemas = {f.name: f.parameters for f in offered}
        parallel = self.parallel and self.named is None
        call_format = self.parser.call_format(schemas, parallel)
        return StructuredOutput.structural_tag({"type": "structural_tag", "format": call_format})

    def parameter_specs(self) -> list[tuple[Any, str]]:
        """Each function's parameters as a json_schema spec, and the param naming it."""
        from engine import StructuredOutput

        return [
            (StructuredOutput.json_schema(f.parameters), f"tools[{f.index}].function.parameters")
            for f in self.functions
        ]

    def prompt_block(self) -> str:
        lines = [
            json.dumps(
                {"name": f.name, "description": f.description or "", "parameters": f.parameters},
                ensure_ascii=False,
            )
            for f in self.functions
        ]
        return GENERIC_TOOL_PROMPT.format(
            functions="\n".join(lines), convention=self.parser.convention()
        )

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools as HF chat templates take them (OpenAI's shape)."""
        return [
            {
                "type": "function",
                "function": {
                    "name": f.name,
                    **({"description": f.description} if f.description else {}),
                    "parameters": f.parameters,
                },
            }
            for f in self.functions
        ]


def renders_tools(template: str | None) -> bool:
    """Whether a chat template renders ``tools`` itself (its text reads the variable)."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


def default_parser(template: str | None) -> str:
    """The family's parser: Llama 3's JSON for a Llama 3 template that renders tools, else
    hermes (Qwen/Hermes templates and the generic tool prompt write ``<tool_call>``)."""
    text = template or ""
    llama3 = "<|start_header_id|>" in text and "<tool_call>" not in text
    return "llama3_json" if renders_tools(template) and llama3 else "hermes"


def _fail(provider: str, message: str, param: str) -> Exception:
    return client_error(provider, message, param)


def _function(provider: str, index: int, tool: Any) -> Function:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise _fail(provider, f"{where}: the local model serves function tools only", where)
    spec = tool.get("function")
    if not isinstance(spec, dict):
        raise _fail(provider, f"{where}.function must be an object", f"{where}.function")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        param = f"{where}.function.name"
        raise _fail(provider, f"{param} must be 1-64 letters, digits, _ . or -", param)
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        param = f"{where}.function.description"
        raise _fail(provider, f"{param} must be a string", param)
    parameters = spec.get("parameters")
    if parameters is None:
        parameters = _EMPTY_PARAMETERS
    if not isinstance(parameters, dict):
        param = f"{where}.function.parameters"
        raise _fail(provider, f"{param} must be a JSON schema object", param)
    return Function(name, description, parameters, index)


def read_tools(provider: str, body: dict[str, Any], parser_name: str) -> ToolPlan | None:
    """The request's tool plan; None when no tool is offered (none, or ``tool_choice: none``)."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _fail(provider, "tools must be an array", "tools")
    functions = tuple(_function(provider, i, tool) for i, tool in enumerate(tools))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise _fail(provider, "tools must name each function once", "tools")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _fail(provider, "parallel_tool_calls must be a boolean", "parallel_tool_calls")
    choice = body.get("tool_choice")
    named = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise _fail(
                provider,
                'tool_choice must be auto, none, required or {"type": "function", '
                '"function": {"name": ...}}',
                "tool_choice",
            )
        if name not in names:
            raise _fail(
                provider, f"tool_choice names {name!r}, which is not among the tools", "tool_choice"
            )
        choice, named = "named", name
    elif choice not in ("auto", "none", "required"):
        raise _fail(
            provider, "tool_choice must be auto, none, required or an object", "tool_choice"
        )
    if choice == "none":
        return None
    if not functions:
        if choice == "auto":
            return None
        raise _fail(provider, f"tool_choice {choice} needs tools", "tool_choice")
    if parser_name not in PARSERS:
        parser_name = "hermes"
    parser = make_parser(parser_name, frozenset(names))
    return ToolPlan(functions, choice, named, parallel is not False, parser)


def _arguments(provider: str, value: Any, param: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _fail(provider, f"{param} must be a JSON object's text", param)
    return parsed


def _calls(provider: str, index: int, calls: Any) -> list[dict[str, Any]]:
    """An assistant turn's ``tool_calls``, with arguments as objects (HF templates' shape)."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(calls, list):
        raise _fail(provider, f"{where} must be an array", where)
    out = []
    for number, call in enumerate(calls):
        at = f"{where}[{number}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _fail(provider, f"{at}.function.name must be a string", f"{at}.function.name")
        arguments = _arguments(provider, function.get("arguments"), f"{at}.function.arguments")
        out.append(
            {
                "id": call.get("id"),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return out


def chat_messages(
    provider: str,
    body: dict[str, Any],
    texts: list[str],
    plan: ToolPlan | None,
    template: str | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The template's messages (``texts``: each message's text content) and its extra
    variables (``tools``), for a template that renders tools or with the generic prompt."""
    native = renders_tools(template)
    parser = plan.parser if plan is not None else make_parser("hermes", frozenset())
    messages: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call_id -> function name, for the tool turns
    for index, message in enumerate(body["messages"]):
        role = message["role"]
        role = "system" if role == "developer" else role  # OpenAI's newer name for system
        text = texts[index]
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            parsed = _calls(provider, index, calls)
            for call in parsed:
                if isinstance(call["id"], str):
                    names[call["id"]] = call["function"]["name"]
            if native:
                messages.append({"role": "assistant", "content": text, "tool_calls": parsed})
                continue
            written = [
                parser.render_call(c["function"]["name"], json.dumps(c["function"]["arguments"]))
                for c in parsed
            ]
            text = "\n".join([text, *written] if text else written)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if native:
                turn = {"role": "tool", "content": text, "tool_call_id": call_id}
                if isinstance(call_id, str) and call_id in names:
                    turn["name"] = names[call_id]
                messages.append(turn)
                continue
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        messages.append({"role": role, "content": text})
    if plan is None:
        return messages, {}
    if native:
        return messages, {"tools": plan.template_tools()}
    block = plan.prompt_block()
    if messages and messages[0]["role"] == "system":
        first = messages[0]["content"]
        messages[0] = {"role": "system", "content": f"{first}\n\n{block}" if first else block}
    else:
        messages.insert(0, {"role": "system", "content": block})
    return messages, {}
