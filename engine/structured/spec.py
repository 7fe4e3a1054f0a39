"""What a request's output must match: one constraint, in vLLM's structured-output terms.

``kind`` is one of ``json_object`` (any JSON object), ``json_schema`` (the JSON text of a
schema), ``regex``, ``choice`` (one of a list of strings), ``grammar`` (an EBNF grammar
in xgrammar's GBNF dialect, or a Lark grammar) and ``structural_tag`` (the JSON of an xgrammar
structural tag: text and JSON schemas in sequence, as tool calls are written). The spec is frozen and hashable: the
compiled grammar is cached by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from engine.errors import SamplingParamsError

Kind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "structural_tag"]
KINDS: tuple[str, ...] = (
    "json_object",
    "json_schema",
    "regex",
    "choice",
    "grammar",
    "structural_tag",
)


@dataclass(frozen=True)
class StructuredOutput:
    kind: Kind
    spec: str = ""  # the schema's JSON, the regex, the choices' JSON list, the grammar

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SamplingParamsError(
                f"structured output kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        if not isinstance(self.spec, str):
            raise SamplingParamsError("a structured output spec must be a string")
        if self.kind != "json_object" and not self.spec:
            raise SamplingParamsError(f"a {self.kind} constraint needs a non-empty spec")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str) -> StructuredOutput:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return cls("json_schema", text)

    @classmethod
    def choice(cls, choices: list[str]) -> StructuredOutput:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise SamplingParamsError("choice must be a non-empty list of strings")
        return cls("choice", json.dumps(list(choices)))

    @classmethod
    def regex(cls, pattern: str) -> StructuredOutput:
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, text: str) -> StructuredOutput:
        return cls("grammar", text)

    @classmethod
    def structural_tag(cls, tag: dict[str, Any]) -> StructuredOutput:
        # keys in their order: a schema's properties are generated in it
        return cls("structural_tag", json.dumps(tag))

    @classmethod
    def json_object(cls) -> StructuredOutput:
        return cls("json_object")
