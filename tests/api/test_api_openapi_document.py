"""The OpenAPI document the gateway serves, generated from its routes and models, against the
one written by hand before it was (``openapi_baseline.json``): every path, method, status code
and media type, parameter and body field (names, required-ness, types) is kept, but for the
differences listed here, each a place where the code, not the old text, is right.

``openapi_baseline.json`` is ``GET /openapi.json`` as served at commit 5a68701, the last with
the hand-written document, written once by
``python -c 'import json; from gateway.api.openapi.document import openapi_document;
print(json.dumps(openapi_document(), indent=1, sort_keys=True))'``; it is not regenerated.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_runner import RunningGateway
from openapi_facts import differences
from starlette.responses import Response
from starlette.routing import Route

from gateway.api.openapi.batches import BATCH_OPERATIONS
from gateway.api.openapi.document import openapi_document

BASELINE = json.loads((Path(__file__).parent / "openapi_baseline.json").read_text())
_ITEM = "GET /v1/models 200 application/json .data[]"
# What the hand-written document had wrong, each fact: (before, after).
CORRECTED = {
    # GET /v1/models lists each model as GET /v1/models/{id} shows it (api/openai.py _entry):
    # the list's items were written as a subset of it, now they are the one Model schema.
    f"{_ITEM}.available": ("(absent)", "required; boolean"),
    f"{_ITEM}.answered_by": ("(absent)", "optional; string"),
    f"{_ITEM}.context_window": ("(absent)", "optional; integer"),
    f"{_ITEM}.description": ("(absent)", "optional; string"),
    f"{_ITEM}.unavailable_reason": ("(absent)", "optional; string"),
    # The /v1 answers are the TypedDicts their builders return (the formats' renderers):
    # - a chat answer's usage has the details of its counts, as the gateway renders it
    #   (formats/openai_chat/response.py ChatUsage) and OpenAI sends it, though a relayed
    #   answer may not (the local engine's);
    **{
        f"POST /v1/{door} 200 application/json .usage.{details}{within}": (
            "(absent)",
            "integer" if within else "optional; object",
        )
        for door in ("chat/completions", "completions")
        for details in ("prompt_tokens_details", "completion_tokens_details")
        for within in ("", "{}")
    },
    # - an embeddings answer counts no completion tokens (formats/openai_embeddings.py);
    "POST /v1/embeddings 200 application/json .usage.completion_tokens": (
        "optional; integer",
        "(absent)",
    ),
    # - a transcription or translation in JSON has its text, an image edit answers as a
    #   generation does: both relayed, where "any object" was written (api/v1/uploads.py);
    **{
        f"POST /v1/audio/{operation} 200 application/json .text": ("(absent)", "required; string")
        for operation in ("transcriptions", "translations")
    },
    "POST /v1/images/edits 200 application/json .created": ("(absent)", "optional; integer"),
    "POST /v1/images/edits 200 application/json .data": ("(absent)", "required; array"),
    # - Anthropic's message has its stop_sequence (render_response always sends it);
    "POST /v1/messages 200 application/json .stop_sequence": ("(absent)", "optional; null|string"),
    # - the Responses API's response object is whole: response_object sends every field, a
    #   relayed answer may leave them out (previous_response_id: stateless, always null).
    **{
        f"POST /v1/responses 200 application/json .{field}": ("(absent)", f"optional; {kind}")
        for field, kind in {
            "created_at": "number",
            "error": "null|object",
            "incomplete_details": "null|object",
            "instructions": "array|null|string",
            "max_output_tokens": "integer|null",
            "metadata": "null|object",
            "parallel_tool_calls": "boolean",
            "previous_response_id": 'null in ["null"]',
            "reasoning": "null|object",
            "store": 'boolean in ["false"]',
            "temperature": "null|number",
            "text": "object",
            "tool_choice": "object|string",
            "tools": "array",
            "top_p": "null|number",
            "truncation": "null|string",
            "user": "null|string",
        }.items()
    },
    **{
        f"POST /v1/responses 200 application/json .{field}[]": ("(absent)", "object")
        for field in ("instructions", "tools")
    },
}
_GROUP_BYS = ("day", "key", "model", "provider", "tag", "task", "team", "user")


def _choices(*values: str) -> str:
    return "string in " + json.dumps([json.dumps(value) for value in sorted(values)])


# What was extended since (each fact: before, after): the usage report groups by batch too.
EXTENDED = {
    f"GET /admin/usage {where}": (
        f"{need}; {_choices(*_GROUP_BYS)}",
        f"{need}; {_choices('batch', *_GROUP_BYS)}",
    )
    for where, need in (
        ("200 application/json .group_by", "required"),
        ("parameter query group_by", "optional"),
    )
}


# Operations added since the baseline (batches.md): every fact of theirs is new.
ADDED = tuple(BATCH_OPERATIONS)


def _added(line: str) -> bool:
    return any(line.startswith((f"{operation} ", f"{operation}:")) for operation in ADDED)


# An answer's field the hand-written text called optional, which its builder's TypedDict now
# says is always there: a promise made stronger, never a break for a client. Only answers
# (``<method> <path> <status> <media> .field``): a body or parameter newly required would be one.
_ANSWER_FIELD = re.compile(r"^[A-Z]+ \S+ \d{3} \S+ \.\S*: optional; (.*) -> required; (.*)$")


def _tightened(line: str) -> bool:
    match = _ANSWER_FIELD.match(line)
    return match is not None and match[1] == match[2]


def _served(gateway: RunningGateway) -> dict[str, Any]:
    answer = httpx.get(gateway.base_url + "/openapi.json")
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_served_document_keeps_every_fact_of_the_hand_written_one(
    gateway: RunningGateway,
) -> None:
    changed = CORRECTED | EXTENDED
    expected = sorted(f"{fact}: {old} -> {new}" for fact, (old, new) in changed.items())
    found = [
        line
        for line in differences(BASELINE, _served(gateway))
        if not _added(line) and not _tightened(line)
    ]
    assert found == expected, "\n".join(sorted(set(found) ^ set(expected)))


def test_only_an_answers_field_counts_as_tightened() -> None:
    answer = "GET /admin/keys 200 application/json .data[].tags: optional; array -> required; array"
    assert _tightened(answer)
    assert not _tightened(answer.replace("-> required; array", "-> required; string"))
    body = "POST /admin/keys body application/json .rpm: optional; integer -> required; integer"
    assert not _tightened(body)
    parameter = "GET /admin/keys parameter query limit: optional; integer -> required; integer"
    assert not _tightened(parameter)


def _changed(edit: Any) -> dict[str, Any]:
    document = copy.deepcopy(BASELINE)
    edit(document["paths"], document["components"]["schemas"])
    return document


def _limit_as_text(paths: dict[str, Any], schemas: dict[str, Any]) -> None:
    for parameter in paths["/admin/keys"]["get"]["parameters"]:
        if parameter["name"] == "limit":
            parameter["schema"] = {"type": "string"}


# Each kind of fact, changed in a copy of the baseline, and the difference that names it.
CHANGES = {
    "DELETE /admin/cache: operation -> (absent)": lambda paths, _: paths["/admin/cache"].pop(
        "delete"
    ),
    "POST /v1/chat/completions 504: answer -> (absent)": lambda paths, _: paths[
        "/v1/chat/completions"
    ]["post"]["responses"].pop("504"),
    "GET /v1/models 200 application/json : object -> (absent)": lambda paths, _: paths[
        "/v1/models"
    ]["get"]["responses"]["200"].pop("content"),
    "GET /admin/keys parameter query limit: optional; integer -> optional; string": (
        _limit_as_text
    ),
    "GET /admin/keys/{key_id} 200 application/json .tags: optional; array -> (absent)": (
        lambda _, schemas: schemas["Key"]["properties"].pop("tags")
    ),
    "POST /admin/keys body application/json .rpm: optional; integer|null -> optional; string": (
        lambda _, schemas: schemas["KeyCreate"]["properties"].update(rpm={"type": "string"})
    ),
    "POST /admin/keys 400 application/json .error: required; object -> optional; object": (
        lambda _, schemas: schemas["Error"].update(required=[])
    ),
}


@pytest.mark.parametrize("expected", CHANGES)
def test_the_comparison_names_each_kind_of_change(expected: str) -> None:
    assert expected in differences(BASELINE, _changed(CHANGES[expected]))


async def _answer(request: Any) -> Response:
    return Response()


def test_a_route_without_an_entry_or_an_entry_without_a_route_is_an_error() -> None:
    routes = [Route("/healthz", _answer, methods=["GET"])]
    with pytest.raises(LookupError, match="documented but not served"):
        openapi_document(routes)
    served = [
        Route(path, _answer, methods=[method])
        for path, item in BASELINE["paths"].items()
        for method in item
    ]
    added = [operation.split(" ", 1) for operation in ADDED]
    served += [Route(path, _answer, methods=[method]) for method, path in added]
    paths = set(BASELINE["paths"]) | {path for _, path in added}
    assert set(openapi_document(served)["paths"]) == paths
    with pytest.raises(LookupError, match="GET /admin/extra is served but has no entry"):
        openapi_document([*served, Route("/admin/extra", _answer, methods=["GET"])])
    # The dashboard's pages are for browsers, not part of the API.
    pages = [*served, Route("/admin/ui/extra", _answer, methods=["GET"])]
    assert "/admin/ui/extra" not in openapi_document(pages)["paths"]
