"""The OpenAPI document the gateway serves, generated from its routes and models, against the
one written by hand before it was (``openapi_baseline.json``): every path, method, status code
and media type, parameter and body field (names, required-ness, types) is kept. What differs
is listed here (``CORRECTED``, ``EXTENDED``) or is an answer's field made a stronger promise (``_strengthened``:
documented, always there, or of fewer types), each a place where the code, not the old text, is
right: the answers' schemas now come from the TypedDicts their builders return.

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
# What the hand-written document had wrong, each fact: (before, after). (Answer fields it
# left out, or called optional, are ``_strengthened`` below.)
CORRECTED = {
    # An embeddings answer counts no completion tokens (formats/openai_embeddings.py).
    "POST /v1/embeddings 200 application/json .usage.completion_tokens": (
        "optional; integer",
        "(absent)",
    ),
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


# What the builders' TypedDicts say of an answer that the hand-written text did not: a field
# it left out is documented, one it called optional is always there, or one it allowed any or
# several types for has fewer (``null|string`` -> ``string``). Promises made stronger or
# fuller, never a break for a client (GET /v1/models, for one, lists each model as
# GET /v1/models/{id} shows it, where the old text wrote a subset). Only answers (``<method>
# <path> <status> <media> .field``): a body or parameter changed so would be a change.
_ANSWER_FIELD = re.compile(r"^[A-Z]+ \S+ \d{3} \S+ \.\S*: (.*) -> (.*)$")


def _need_and_types(fact: str) -> tuple[str, set[str], str]:
    need, _, kind = fact.rpartition("; ")
    types, _, values = kind.partition(" in ")
    return need, set(types.split("|")), values


def _strengthened(line: str) -> bool:
    match = _ANSWER_FIELD.match(line)
    if match is None or match[2] == "(absent)":
        return False
    if match[1] == "(absent)":
        return True
    need, types, values = _need_and_types(match[1])
    new_need, new_types, new_values = _need_and_types(match[2])
    return (
        need in (new_need, "optional")
        and (types == {"any"} or new_types <= types)
        and values == new_values
    )


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
        if not _added(line) and not _strengthened(line)
    ]
    assert found == expected, "\n".join(sorted(set(found) ^ set(expected)))


def test_only_an_answers_fields_may_be_strengthened() -> None:
    answer = "GET /admin/keys 200 application/json .data[].tags: optional; array -> required; array"
    assert _strengthened(answer)
    assert not _strengthened(answer.replace("-> required; array", "-> required; string"))
    assert _strengthened(answer.replace("optional; array ->", "optional; any ->"))
    assert _strengthened(answer.replace("optional; array ->", "optional; array|null ->"))
    assert not _strengthened(
        answer.replace("optional; array ->", "required; array ->").replace(
            "-> required; array", "-> optional; array"
        )
    )
    assert _strengthened(
        "GET /admin/keys 200 application/json .data[].x: (absent) -> required; array"
    )
    assert not _strengthened(
        "GET /admin/keys 200 application/json .data[].tags: optional; array -> (absent)"
    )
    body = "POST /admin/keys body application/json .rpm: optional; integer -> required; integer"
    assert not _strengthened(body)
    assert not _strengthened(
        "POST /admin/keys body application/json .x: (absent) -> optional; integer"
    )
    parameter = "GET /admin/keys parameter query limit: optional; integer -> required; integer"
    assert not _strengthened(parameter)


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
