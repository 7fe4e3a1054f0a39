"""Tool-call parsers per model family, like vLLM's ``--tool-call-parser``.

A parser knows how its family writes a call: ``hermes`` (Qwen, Hermes and the generic tool
prompt) ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several in a row being
parallel calls; ``llama3_json`` (Llama 3.x) a bare JSON object ``{"name": ..., "parameters":
{...}}``, several separated by ``;``. It turns the model's text into content and calls
(``ToolStream``, fed delta by delta, so a stream and a whole answer split alike at any chunk
boundary), and gives the grammar of a call for ``required``/named ``tool_choice``: an xgrammar
structural tag in its own syntax, each call's arguments matching the offered function's schema.

A call whose JSON does not parse, or names a function not offered, stays text: ``auto`` never
fails on a malformed call. A raw control character inside a JSON string is read (``strict=False``;
the arguments go out re-encoded, escaped): the call grammar's strings let them through, and the
mask cannot ban them there without banning the newlines the call's own syntax is written with. Call text never reaches the content, also not in a stream: text that
may be the start of a call is held until it is known not to be.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from gateway.formats.internal import ToolCall

PARSERS: tuple[str, ...] = ("hermes", "llama3_json")


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Piece:
    """What a stream yields: content text, or one whole call."""

    content: str = ""
    call: ToolCall | None = None


class ToolParser(ABC):
    name: str

    def __init__(self, functions: frozenset[str]) -> None:
        self.functions = functions  # the offered functions' names: a call names one of them

    @abstractmethod
    def stream(self) -> ToolStream: ...

    @abstractmethod
    def call_format(self, schemas: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
        """The xgrammar structural-tag format of one call (several if ``parallel``) to one of
        ``schemas`` (name -> parameters schema)."""

    @abstractmethod
    def render_call(self, name: str, arguments: str) -> str:
        """A past call as this family writes it (for templates that do not render calls)."""

    @abstractmethod
    def convention(self) -> str:
        """How the generic tool prompt tells the model to write a call."""

    def call(self, payload: Any) -> ToolCall | None:
        """``payload`` (parsed JSON) as a call, or None when it is not one. Either family's
        name for the arguments is read (``arguments``, ``parameters``)."""
        if not isinstance(payload, dict) or set(payload) - {"name", "arguments", "parameters"}:
            return None
        if "arguments" in payload and "parameters" in payload:
            return None
        name = payload.get("name")
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if not isinstance(name, str) or name not in self.functions:
            return None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(_call_id(), name, json.dumps(arguments, ensure_ascii=False))

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole output: its content (None when only calls) and its calls."""
        stream = self.stream()
        pieces = stream.feed(text) + stream.finish()
        content = "".join(p.content for p in pieces)
        calls = [p.call for p in pieces if p.call is not None]
        return (content or None) if calls else content, calls


def _call_schema(schemas: dict[str, dict[str, Any]], key: str) -> dict[str, Any]:
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, key: parameters},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for name, parameters in schemas.items()
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _json_format(schema: dict[str, Any]) -> dict[str, Any]:
    # one whitespace at most between tokens: a model cannot spend its budget on blanks
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 1}


def _repeated(one: dict[str, Any], separator: str, parallel: bool) -> dict[str, Any]:
    if not parallel:
        return one
    more = {"type": "sequence", "elements": [{"type": "const_string", "value": separator}, one]}
    return {"type": "sequence", "elements": [one, {"type": "star", "content": more}]}


class ToolStream(ABC):
    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.calls = 0
        self._blank = ""  # whitespace held back: dropped if a call follows it

    @abstractmethod
    def feed(self, text: str) -> list[Piece]: ...

    @abstractmethod
    def finish(self) -> list[Piece]: ...

    def _content(self, text: str) -> list[Piece]:
        # trailing whitespace waits: a call next drops it, content next gets it back
        text = self._blank + text
        body = text.rstrip()
        self._blank = text[len(body) :]
        return [Piece(content=body)] if body else []

    def _call(self, call: ToolCall) -> list[Piece]:
        self.calls += 1
        self._blank = ""
        return [Piece(call=call)]

    def _end(self) -> list[Piece]:
        blank, self._blank = self._blank, ""
        return [Piece(content=blank)] if blank and not self.calls else []


# --- hermes ----------------------------------------------------------------------------------

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolParser):
    name = "hermes"

    def stream(self) -> ToolStream:
        return _HermesStream(self)

    def call_format(self, schemas: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
        tag = {
            "type": "tag",
            "begin": _OPEN + "\n",
            "content": _json_format(_call_schema(schemas, "arguments")),
            "end": "\n" + _CLOSE,
        }
        return _repeated(tag, "\n", parallel)

    def render_call(self, name: str, arguments: str) -> str:
        return f'{_OPEN}\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n{_CLOSE}'

    def convention(self) -> str:
        return (
            "To call a function, answer with its name and arguments as one JSON object inside "
            f'{_OPEN}{_CLOSE} tags:\n{_OPEN}\n{{"name": <function-name>, "arguments": '
            f"<arguments-json-object>}}\n{_CLOSE}\nWrite one such block per call."
        )


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (may grow into it)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class _HermesStream(ToolStream):
    def __init__(self, parser: ToolParser) -> None:
        super().__init__(parser)
        self._pending = ""
        self._inside = False

    def feed(self, text: str) -> list[Piece]:
        self._pending += text
        pieces: list[Piece] = []
        while True:
            if not self._inside:
                at = self._pending.find(_OPEN)
                if at < 0:
                    keep = _held_prefix(self._pending, _OPEN)
                    cut = len(self._pending) - keep
                    pieces += self._content(self._pending[:cut])
                    self._pending = self._pending[cut:]
                    return pieces
                pieces += self._content(self._pending[:at])
                self._pending = self._pending[at + len(_OPEN) :]
                self._inside = True
            at = self._pending.find(_CLOSE)
            if at < 0:
                return pieces
            body = self._pending[:at]
            self._pending = self._pending[at + len(_CLOSE) :]
            self._inside = False
            try:
                call = self.parser.call(json.loads(body, strict=False))
            except ValueError:
                call = None
            if call is None:
                pieces += self._content(_OPEN + body + _CLOSE)
            else:
                pieces += self._call(call)

    def finish(self) -> list[Piece]:
        rest = (_OPEN if self._inside else "") + self._pending  # an unclosed call is text
        self._pending, self._inside = "", False
        return self._content(rest) + self._end()


# --- llama3_json -----------------------------------------------------------------------------

_PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"

    def stream(self) -> ToolStream:
        return _Llama3Stream(self)

    def call_format(self, schemas: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
        return _repeated(_json_format(_call_schema(schemas, "parameters")), "; ", parallel)

    def render_call(self, name: str, arguments: str) -> str:
        return f'{{"name": {json.dumps(name)}, "parameters": {arguments}}}'

    def convention(self) -> str:
        return (
            "To call a function, answer with nothing but one JSON object of its name and "
            'arguments: {"name": <function-name>, "parameters": <arguments-json-object>}. '
            "Separate several calls with '; '."
        )

    def calls(self, text: str) -> list[ToolCall] | None:
        """``{...}; {...}`` as calls, or None unless the whole text is such calls."""
        decoder, at, found = json.JSONDecoder(strict=False), 0, []
        while True:
            try:
                payload, at = decoder.raw_decode(text, at)
            except ValueError:
                return None
            call = self.call(payload)
            if call is None:
                return None
            found.append(call)
            rest = text[at:].lstrip()
            if not rest:
                return found
            if not rest.startswith(";"):
                return None
            at = len(text) - len(rest) + 1
            while at < len(text) and text[at].isspace():
                at += 1


class _Llama3Stream(ToolStream):
    """A call is the whole answer: text that opens with ``{`` is held to the end, then read."""

    def __init__(self, parser: Llama3JsonParser) -> None:
        super().__init__(parser)
        self.llama = parser
        self._held = ""
        self._mode = "start"  # start -> json (held) | text (passed through)

    def feed(self, text: str) -> list[Piece]:
        if self._mode == "text":
            return self._content(text)
        self._held += text
        if self._mode == "json":
            return []
        body = self._held.lstrip()
        if body.startswith(_PYTHON_TAG):
            body = body[len(_PYTHON_TAG) :].lstrip()
        elif _PYTHON_TAG.startswith(body):
            return []  # may still become the tag
        if not body:
            return []
        if body.startswith("{"):
            self._mode = "json"
            return []
        self._mode = "text"
        held, self._held = self._held, ""
        return self._content(held)

    def finish(self) -> list[Piece]:
        held, self._held = self._held, ""
        body = held.strip()
        if body.startswith(_PYTHON_TAG):
            body = body[len(_PYTHON_TAG) :].lstrip()
        calls = self.llama.calls(body) if self._mode == "json" else None
        if calls is None:
            return self._content(held) + self._end()
        pieces: list[Piece] = []
        for call in calls:
            pieces += self._call(call)
        return pieces


def make_parser(name: str, functions: frozenset[str]) -> ToolParser:
    if name == "llama3_json":
        return Llama3JsonParser(functions)
    return HermesParser(functions)
