"""What two OpenAPI documents are compared on: every operation (path and method), its status
codes and their media types, its parameters (where, required, types) and every field of its
request and response bodies (required, types), references resolved, so that the names of
schemas do not matter. A fact is a line such as ``POST /v1/chat/completions body
application/json .messages[role=user].content`` with its value ``required; array|string``.

Unions of objects are split by the property that tells them apart (a message's ``role``);
``integer`` and ``number`` together read ``number`` (pydantic's ``int | float``)."""

from __future__ import annotations

import json
from typing import Any

Schema = dict[str, Any]
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_DEPTH = 12


class _Reader:
    def __init__(self, document: Schema, details: bool) -> None:
        self.schemas = document.get("components", {}).get("schemas", {})
        self.details = details

    def resolve(self, schema: Any) -> Schema:
        seen = 0
        while isinstance(schema, dict) and "$ref" in schema:
            schema = self.schemas[schema["$ref"].rsplit("/", 1)[1]]
            seen += 1
            assert seen < 50, "a reference loop"
        return schema if isinstance(schema, dict) else {}

    def alternatives(self, schema: Any) -> list[Schema]:
        """The non-union schemas ``schema`` may be, an ``allOf`` merged into one."""
        schema = self.resolve(schema)
        for word in ("anyOf", "oneOf"):
            if word in schema:
                rest = {k: v for k, v in schema.items() if k not in (word, "discriminator")}
                # The words beside the union (bounds, a description) hold for each option.
                return [
                    rest | alternative
                    for option in schema[word]
                    for alternative in self.alternatives(option)
                ]
        if "allOf" in schema:
            merged: Schema = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                for alternative in self.alternatives(part):
                    merged.setdefault("properties", {}).update(alternative.get("properties", {}))
                    merged["required"] = [
                        *merged.get("required", ()),
                        *alternative.get("required", ()),
                    ]
                    merged.setdefault("type", alternative.get("type"))
            return [merged]
        return [schema]

    def facts(self, schema: Any, where: str, out: dict[str, str], depth: int = 0) -> None:
        """The type of ``schema`` at ``where``, and every field under it."""
        alternatives = self.alternatives(schema)
        out[where] = _types(alternatives)
        if self.details:
            out[where] += _details(alternatives)
        if depth > _DEPTH:
            return
        objects = [a for a in alternatives if "properties" in a or a.get("type") == "object"]
        tag, groups = _by_tag([_named_properties(a) for a in objects])
        for label, group in groups.items():
            at = f"{where}{label}"
            names = dict.fromkeys(name for a in group for name in a.get("properties", {}))
            for name in names:
                if name == tag:
                    out[f"{at}.{name}"] = "the tag"
                    continue
                holders = [a for a in group if name in a.get("properties", {})]
                required = all(name in a.get("required", ()) for a in group)
                field = f"{at}.{name}"
                self.facts(
                    {"anyOf": [a["properties"][name] for a in holders]}, field, out, depth + 1
                )
                out[field] = ("required; " if required else "optional; ") + out[field]
            extras = [
                a["additionalProperties"]
                for a in group
                if isinstance(a.get("additionalProperties"), dict)
            ]
            if extras:
                self.facts({"anyOf": extras}, f"{at}{{}}", out, depth + 1)
        items = [a["items"] for a in alternatives if isinstance(a.get("items"), dict)]
        if items:
            self.facts({"anyOf": items}, f"{where}[]", out, depth + 1)


def _types(alternatives: list[Schema]) -> str:
    """The JSON types ``alternatives`` allow, and the values when every one is a choice of
    values (``null`` counting as one)."""
    types: set[str] = set()
    values: list[Any] = []
    chosen = True
    for alternative in alternatives:
        kind = alternative.get("type")
        if "const" in alternative or "enum" in alternative:
            choices = [alternative["const"]] if "const" in alternative else alternative["enum"]
            values += choices
            types |= {_json_type(value) for value in choices}
            continue
        if kind == "null":
            values.append(None)
        else:
            chosen = False
        if isinstance(kind, list):
            types |= set(kind)
        elif kind:
            types.add(kind)
        else:
            types.add("object" if "properties" in alternative else "any")
    if {"integer", "number"} <= types:
        types.discard("integer")
    text = "|".join(sorted(types))
    if chosen and values:
        text += " in " + json.dumps(sorted(set(map(json.dumps, values))))
    return text


# What ``details`` adds to a fact: the words beyond names, types and required-ness.
DETAIL_WORDS = (
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "format", "minItems", "maxItems", "uniqueItems", "default", "description",
)  # fmt: skip


def _details(alternatives: list[Schema]) -> str:
    found = sorted(
        {
            f"{word}={json.dumps(a[word])}"
            for a in alternatives
            for word in DETAIL_WORDS
            if word in a and not (word == "default" and a[word] is None)
        }
    )
    closed = any(a.get("additionalProperties") is False for a in alternatives)
    return "".join(f"; {item}" for item in found) + ("; closed" if closed else "")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _by_tag(objects: list[Schema]) -> tuple[str | None, dict[str, list[Schema]]]:
    """The property that tells ``objects`` apart, if one does, and the objects grouped by its
    values (``[role=user]``)."""
    if len(objects) < 2:
        return None, {"": objects} if objects else {}
    for name in objects[0].get("properties", {}):
        values = [_tag_values(a.get("properties", {}).get(name)) for a in objects]
        if all(values):
            groups: dict[str, list[Schema]] = {}
            for alternative, choices in zip(objects, values, strict=True):
                for value in choices:
                    groups.setdefault(f"[{name}={value}]", []).append(alternative)
            return name, groups
    return None, {"": objects}


def _named_properties(schema: Schema) -> Schema:
    """An object whose property names are a choice of values (pydantic's ``dict[Literal[...],
    X]``) as the object with those optional properties, each an ``X``."""
    names = _tag_values(schema.get("propertyNames"))
    value = schema.get("additionalProperties")
    if not names or not isinstance(value, dict):
        return schema
    rest = {k: v for k, v in schema.items() if k not in ("propertyNames", "additionalProperties")}
    return rest | {"properties": dict.fromkeys(names, value), "additionalProperties": False}


def _tag_values(schema: Any) -> list[Any]:
    if not isinstance(schema, dict):
        return []
    if "const" in schema:
        return [schema["const"]]
    return list(schema.get("enum", ()))


def document_facts(document: Schema, details: bool = False) -> dict[str, str]:
    """Every fact of ``document``; ``details``: with the constraints and descriptions too."""
    reader = _Reader(document, details)
    out: dict[str, str] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            if method not in item:
                continue
            operation = item[method]
            name = f"{method.upper()} {path}"
            out[name] = "operation"
            for parameter in operation.get("parameters", ()):
                where = f"{name} parameter {parameter['in']} {parameter['name']}"
                out[where] = _types(reader.alternatives(parameter.get("schema", {})))
                out[where] = ("required; " if parameter.get("required") else "optional; ") + out[
                    where
                ]
                if details:
                    schema = parameter.get("schema", {}) | (
                        {"description": parameter["description"]}
                        if "description" in parameter
                        else {}
                    )
                    out[where] += _details(reader.alternatives(schema))
            body = operation.get("requestBody")
            if body is not None:
                out[f"{name} body"] = "required" if body.get("required") else "optional"
                for media, content in body.get("content", {}).items():
                    reader.facts(content.get("schema", {}), f"{name} body {media} ", out)
            for status, response in operation.get("responses", {}).items():
                out[f"{name} {status}"] = "answer"
                for media, content in response.get("content", {}).items():
                    reader.facts(content.get("schema", {}), f"{name} {status} {media} ", out)
    return out


def differences(before: Schema, after: Schema, details: bool = False) -> list[str]:
    """Every fact that is in one document and not the other, or differs, one line each."""
    old, new = document_facts(before, details), document_facts(after, details)
    lines = []
    for fact in sorted(old.keys() | new.keys()):
        if old.get(fact) != new.get(fact):
            lines.append(f"{fact}: {old.get(fact, '(absent)')} -> {new.get(fact, '(absent)')}")
    return lines
