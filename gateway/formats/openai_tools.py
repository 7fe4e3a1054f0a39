"""Tools and tool choice where both OpenAI formats (Chat Completions, Responses) treat them alike.

A function definition has the same fields in both (``name``, ``description``, ``parameters``,
``strict``), nested under ``function`` in Chat Completions and flat in the Responses API.
A ``tool_choice`` is a mode (``auto``, ``none``, ``required``) or an object; each format names
a function in its own object shape, so ``tool_choice_mode`` reads up to the object and leaves
it to the format. In a body, ``parallel_tool_calls`` goes only with tools and ``tool_choice``
only with tools too (OpenAI refuses it alone); each format renders its own tool objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.formats.errors import MalformedRequest
from gateway.formats.fields import at, obj, opt_bool, opt_str
from gateway.formats.internal import ChatRequest, Raw, Tool, ToolChoice

MODES = ("auto", "none", "required")


def function_fields(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """A function definition's ``description``, ``parameters`` and ``strict``, read at ``path``
    (the ``Tool`` fields besides its name, which each format checks its own way)."""
    parameters = spec.get("parameters")
    return {
        "description": opt_str(spec, "description", at(path, "description")),
        "parameters": None if parameters is None else obj(parameters, at(path, "parameters")),
        "strict": opt_bool(spec, "strict", at(path, "strict")),
    }


def tool_choice_mode(choice: Any) -> ToolChoice | dict[str, Any] | None:
    """None, a mode as a ``ToolChoice``, or the object form for the format to read."""
    if choice is None:
        return None
    if choice in MODES:
        return ToolChoice(choice)
    if isinstance(choice, str):
        raise MalformedRequest(
            "tool_choice must be auto, none, required or an object", param="tool_choice"
        )
    return obj(choice, "tool_choice")


def put_tools(
    body: dict[str, Any],
    request: ChatRequest,
    render_tool: Callable[[Tool | Raw], dict[str, Any]],
    render_choice: Callable[[ToolChoice | Raw], Any],
) -> None:
    if request.tools:
        body["tools"] = [render_tool(tool) for tool in request.tools]
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.tool_choice is not None and request.tools:  # OpenAI refuses it without tools
        body["tool_choice"] = render_choice(request.tool_choice)
