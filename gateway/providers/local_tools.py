"""Tool calling on the local engine: a chat request's tools, ``tool_choice`` and
``parallel_tool_calls`` (the internal form) read into a ``ToolPlan``, and the grammar of a
forced call.

The prompt: a chat template that renders ``tools`` (its text names them, as Qwen's, Hermes' and
Llama 3.1's do) gets them and the conversation's calls and results as HF passes them. Any other
template (SmolLM2's) gets the generic tool prompt (``GENERIC_TOOL_PROMPT``) in its system turn,
past calls written in the parser's syntax and results as ``<tool_response>`` user turns
(``local_chat.py``).

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

from gateway.formats.internal import ChatRequest, Raw, Tool
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
class ToolPlan:
    functions: tuple[Tool, ...]  # in the request's order, each with its parameters' schema
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
        schemas = {f.name: _parameters(f) for f in offered}
        parallel = self.parallel and self.named is None
        call_format = self.parser.call_format(schemas, parallel)
        return StructuredOutput.structural_tag({"type": "structural_tag", "format": call_format})

    def parameter_specs(self) -> list[tuple[Any, str]]:
        """Each function's parameters as a json_schema spec, and the param naming it."""
        from engine import StructuredOutput

        return [
            (StructuredOutput.json_schema(_parameters(f)), f"tools[{index}].function.parameters")
            for index, f in enumerate(self.functions)
        ]

    def prompt_block(self) -> str:
        lines = [
            json.dumps(
                {"name": f.name, "description": f.description or "", "parameters": _parameters(f)},
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
                    "parameters": _parameters(f),
                },
            }
            for f in self.functions
        ]


def _parameters(function: Tool) -> dict[str, Any]:
    return function.parameters if function.parameters is not None else _EMPTY_PARAMETERS


def renders_tools(template: str | None) -> bool:
    """Whether a chat template renders ``tools`` itself (its text reads the variable)."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


def default_parser(template: str | None) -> str:
    """The family's parser: Llama 3's JSON for a Llama 3 template that renders tools, else
    hermes (Qwen/Hermes templates and the generic tool prompt write ``<tool_call>``)."""
    text = template or ""
    llama3 = "<|start_header_id|>" in text and "<tool_call>" not in text
    return "llama3_json" if renders_tools(template) and llama3 else "hermes"


def _function(provider: str, index: int, tool: Tool | Raw) -> Tool:
    where = f"tools[{index}]"
    if isinstance(tool, Raw):
        raise client_error(provider, f"{where}: the local model serves function tools only", where)
    if not _NAME.match(tool.name):
        param = f"{where}.function.name"
        raise client_error(provider, f"{param} must be 1-64 letters, digits, _ . or -", param)
    return tool


def _choice(provider: str, request: ChatRequest, names: list[str]) -> tuple[str, str | None]:
    """The request's ``tool_choice`` as (auto | none | required | named, the function named)."""
    choice = request.tool_choice
    if not request.tools and not request.same_format("openai_chat"):
        choice = None  # a translated request without tools carries none either
    if choice is None:
        return "auto", None
    if isinstance(choice, Raw):
        raise client_error(
            provider,
            'tool_choice must be auto, none, required or {"type": "function", '
            '"function": {"name": ...}}',
            "tool_choice",
        )
    if choice.mode != "tool":
        return choice.mode, None
    if choice.name not in names:
        raise client_error(
            provider,
            f"tool_choice names {choice.name!r}, which is not among the tools",
            "tool_choice",
        )
    return "named", choice.name


def read_tools(provider: str, request: ChatRequest, parser_name: str) -> ToolPlan | None:
    """The request's tool plan; None when no tool is offered (none, or ``tool_choice: none``)."""
    functions = tuple(_function(provider, i, tool) for i, tool in enumerate(request.tools))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise client_error(provider, "tools must name each function once", "tools")
    choice, named = _choice(provider, request, names)
    if choice == "none":
        return None
    if not functions:
        if choice == "auto":
            return None
        raise client_error(provider, f"tool_choice {choice} needs tools", "tool_choice")
    if parser_name not in PARSERS:
        parser_name = "hermes"
    parser = make_parser(parser_name, frozenset(names))
    parallel = request.parallel_tool_calls is not False
    return ToolPlan(functions, choice, named, parallel, parser)
