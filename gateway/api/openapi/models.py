"""JSON Schema of the models that validate, for the OpenAPI document: the msgspec Structs of
the /v1 bodies (``api/v1/request_models.py``), the pydantic models of the admin bodies, query
strings and answers, and the ``TypedDict`` each builder of an answer returns (a record's
``public_view``, a report), which msgspec reads as it reads Structs. Both libraries emit JSON
Schema; this points their references at
``#/components/schemas/`` and tidies what they emit beyond it (pydantic's titles made up from
field names, and the ``ge``/``le`` it leaves unconverted on a union such as ``int | float``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, is_typeddict

import msgspec
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

Schema = dict[str, Any]
COMPONENTS = "#/components/schemas/"
REF_TEMPLATE = COMPONENTS + "{name}"
# pydantic's names for bounds, where it could not turn them into JSON Schema's.
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs")
_SUBSCHEMAS = ("items", "additionalProperties", "propertyNames", "not", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def ref(name: str) -> Schema:
    return {"$ref": COMPONENTS + name}


def tidy(schema: Schema) -> Schema:
    """``schema`` without titles and empty ``required`` lists, its bounds in JSON Schema's
    words; the names of properties are left alone (a field may be called ``title``)."""
    out: Schema = {}
    for word, value in schema.items():
        if (word == "title" and isinstance(value, str)) or (word == "required" and not value):
            continue
        if word in _SCHEMA_MAPS:
            out[word] = {name: tidy(sub) for name, sub in value.items()}
        elif word in _SUBSCHEMAS and isinstance(value, dict):
            out[word] = tidy(value)
        elif word in _SCHEMA_LISTS:
            out[word] = [tidy(sub) for sub in value]
        else:
            out[_BOUNDS.get(word, word)] = value
    return out


def model_components(models: Iterable[type]) -> dict[str, Schema]:
    """The components of ``models`` and of every model they name, by class name: msgspec
    Structs and TypedDicts, pydantic models, and dataclasses (which pydantic reads too). Two
    different models of one name are refused: the document would show one in place of the
    other."""
    structs: list[type] = []
    validated: list[tuple[type[BaseModel], Any]] = []
    plain: list[type] = []
    for model in dict.fromkeys(models):
        if is_typeddict(model) or issubclass(model, msgspec.Struct):
            structs.append(model)
        elif issubclass(model, BaseModel):
            validated.append((model, "validation"))
        else:
            plain.append(model)
    sources: list[dict[str, Schema]] = []
    if structs:
        sources.append(msgspec.json.schema_components(structs, ref_template=REF_TEMPLATE)[1])
    if validated:
        defs = models_json_schema(validated, ref_template=COMPONENTS + "{model}")[1]
        sources.append(defs.get("$defs", {}))
    for shape in plain:
        schema = TypeAdapter(shape).json_schema(ref_template=COMPONENTS + "{model}")
        sources.append(schema.pop("$defs", {}) | {shape.__name__: schema})
    components: dict[str, Schema] = {}
    for source in sources:
        if components.keys() & source.keys():
            raise ValueError(f"models named alike: {sorted(components.keys() & source.keys())}")
        components |= {name: tidy(schema) for name, schema in source.items()}
    return components


def without_null(schema: Schema) -> Schema:
    """``schema`` less its ``null`` alternative: a query parameter that is absent is None, but
    one that is present is never null."""
    options = [option for option in schema.get("anyOf", ()) if option != {"type": "null"}]
    if not options or len(options) == len(schema["anyOf"]):
        return schema
    rest = {word: value for word, value in schema.items() if word != "anyOf"}
    if rest.get("default", ...) is None:
        del rest["default"]
    return (options[0] | rest) if len(options) == 1 else {"anyOf": options, **rest}


def query_parameters(model: type[BaseModel]) -> list[Schema]:
    """The query parameters a pydantic model reads, each with its schema and whether it is
    required (aliases are the names on the wire: ``from``)."""
    schema = tidy(model.model_json_schema(ref_template=COMPONENTS + "{model}"))
    if "$defs" in schema:
        raise ValueError(f"{model.__name__}: a query parameter cannot be an object")
    required = set(schema.get("required", ()))
    parameters = []
    for name, field in schema["properties"].items():
        field = without_null(field)
        description = field.pop("description", None)
        parameter: Schema = {"name": name, "in": "query", "required": name in required}
        if description:
            parameter["description"] = description
        parameters.append(parameter | {"schema": field})
    return parameters
