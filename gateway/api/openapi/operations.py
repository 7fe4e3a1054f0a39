"""The parts the gateway's OpenAPI operations are built from: error responses in OpenAI's
envelope, admin operations (``adminKey``, the admin error statuses), query parameters, and the
reports answered as JSON or CSV. ``openapi.py`` and ``openapi_governance.py`` both use them."""

from __future__ import annotations

from typing import Any

from gateway.api.openapi.schemas import ref

JSON = "application/json"
Operation = dict[str, Any]


def json_content(schema: dict[str, Any]) -> dict[str, Any]:
    return {JSON: {"schema": schema}}


def error_responses(*statuses: int) -> dict[str, Any]:
    reasons = {
        400: "invalid request (names the field in error.param)",
        401: "missing or unknown credentials",
        403: "the key may not do this",
        404: "no such resource or model",
        408: "the request did not arrive in time",
        409: "conflict",
        413: "body too large",
        429: "rate limit or budget exceeded, or too many failed admin credentials",
        431: "headers too large",
        502: "upstream failed",
        503: "Redis, policy or upstream unavailable, or the gateway is shutting down",
        504: "upstream timed out",
    }
    return {
        str(status): {"description": reasons[status], "content": json_content(ref("Error"))}
        for status in statuses
    }


V1_ERRORS = (400, 401, 403, 404, 413, 429, 502, 503, 504)
ADMIN_ERRORS = (400, 401, 403, 429, 503)


def admin(
    summary: str,
    ok: str | None,
    *,
    status: str = "200",
    body: str | None = None,
    params: list[dict[str, Any]] | None = None,
    errors: tuple[int, ...] = ADMIN_ERRORS,
    ok_content: dict[str, Any] | None = None,
) -> Operation:
    operation: Operation = {
        "summary": summary,
        "tags": ["admin"],
        "security": [{"adminKey": []}],
        "responses": {
            status: {
                "description": "ok",
                "content": ok_content if ok_content is not None else json_content(ref(ok or "")),
            }
        }
        | error_responses(*errors),
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": json_content(ref(body))}
        operation["responses"] |= error_responses(413)  # a body over the size limit
    if params:
        operation["parameters"] = params
    return operation


def record_admin(
    summary: str,
    ok: str,
    record_id: dict[str, Any],
    *also: int,
    body: str | None = None,
    headers: list[dict[str, Any]] | None = None,
) -> Operation:
    """An admin operation on the record that the path parameter ``record_id`` names: 404 when
    there is none, and the statuses in ``also``."""
    return admin(
        summary,
        ok,
        body=body,
        params=[record_id, *(headers or [])],
        errors=(*ADMIN_ERRORS, 404, *also),
    )


def query(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema} | (
        {"description": description} if description else {}
    )


DAY = {"type": "string", "format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
# ``format=csv`` turns a report's JSON answer into CSV.
CSV_FORMAT = query("format", {"enum": ["json", "csv"]})


def csv_report(summary: str, schema: str, params: list[dict[str, Any]]) -> Operation:
    """An admin report: ``schema`` as JSON, or CSV text with ``format=csv``."""
    return admin(
        summary,
        None,
        params=[*params, CSV_FORMAT],
        ok_content=json_content(ref(schema)) | {"text/csv": {"schema": {"type": "string"}}},
    )
