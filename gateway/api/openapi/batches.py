"""What the OpenAPI document says of the batch operations (``api/v1/files.py``,
``api/v1/batches.py``, ``api/v1/message_batches.py``, ``api/admin/batches.py``): their
entries, as in ``operations.py``, and the schemas of the answers the handlers build as dicts
(``api/v1/batch_views.py``), as in ``unmodelled.py``. ``document.py`` adds them to the
others."""

from __future__ import annotations

from gateway.api.admin.batches import AdminBatchQuery
from gateway.api.openapi.models import Schema, ref
from gateway.api.openapi.operations import Operation, json
from gateway.api.openapi.unmodelled import BOOLEAN, INTEGER, STRING, list_of, nullable, obj
from gateway.api.v1.batches import BatchCreate, BatchListQuery
from gateway.api.v1.files import FileListQuery
from gateway.api.v1.message_batches import MessageBatchListQuery
from gateway.batches.jsonl import CUSTOM_ID
from gateway.batches.records import BatchStatus

V1_BATCH_ERRORS = (400, 401, 404, 409, 503)
BINARY = {"type": "string", "format": "binary"}
STATUSES = list(BatchStatus.__args__)  # type: ignore[attr-defined]
SECONDS = nullable(INTEGER)
TIME = nullable({"type": "string", "format": "date-time"})
PAGE_IDS: dict[str, Schema] = {
    "has_more": BOOLEAN,
    "first_id": nullable(STRING),
    "last_id": nullable(STRING),
}

BATCH_SCHEMAS: dict[str, Schema] = {
    "FileUpload": obj(
        {"purpose": {"enum": ["batch"]}, "file": BINARY},
        ["purpose", "file"],
        description="multipart/form-data: a JSONL file of a batch's requests",
    ),
    "File": obj(
        {
            "id": STRING,
            "object": {"const": "file"},
            "bytes": INTEGER,
            "created_at": INTEGER,
            "filename": STRING,
            "purpose": {"enum": ["batch", "batch_output"]},
            "status": {"const": "processed"},
            "status_details": {"type": "null"},
            "expires_at": {"type": "null"},
        },
        ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
    ),
    "FileList": list_of("File", **PAGE_IDS),
    "FileDeleted": obj(
        {"id": STRING, "object": {"const": "file"}, "deleted": BOOLEAN},
        ["id", "object", "deleted"],
    ),
    "Batch": obj(
        {
            "id": STRING,
            "object": {"const": "batch"},
            "endpoint": STRING,
            "errors": nullable(
                obj(
                    {
                        "object": {"const": "list"},
                        "data": {
                            "type": "array",
                            "items": obj(
                                {
                                    "code": STRING,
                                    "message": STRING,
                                    "param": nullable(STRING),
                                    "line": nullable(INTEGER),
                                },
                                ["code", "message"],
                            ),
                        },
                    },
                    ["object", "data"],
                )
            ),
            "input_file_id": nullable(STRING),
            "completion_window": {"const": "24h"},
            "status": {"enum": STATUSES},
            "output_file_id": nullable(STRING),
            "error_file_id": nullable(STRING),
            "created_at": INTEGER,
            "expires_at": INTEGER,
            **dict.fromkeys(
                (
                    "in_progress_at",
                    "finalizing_at",
                    "completed_at",
                    "failed_at",
                    "expired_at",
                    "cancelling_at",
                    "cancelled_at",
                ),
                SECONDS,
            ),
            "request_counts": obj(
                {"total": INTEGER, "completed": INTEGER, "failed": INTEGER},
                ["total", "completed", "failed"],
            ),
            "metadata": nullable({"type": "object", "additionalProperties": STRING}),
        },
        ["id", "object", "endpoint", "status", "created_at", "request_counts"],
    ),
    "BatchList": list_of("Batch", **PAGE_IDS),
    "AdminBatch": {
        "allOf": [
            ref("Batch"),
            obj({"api": {"enum": ["openai", "anthropic"]}, "key_id": STRING}, ["api", "key_id"]),
        ]
    },
    "AdminBatchList": list_of("AdminBatch", has_more=BOOLEAN),
    "MessageBatchCreate": obj(
        {
            "requests": {
                "type": "array",
                "minItems": 1,
                "items": obj(
                    {
                        "custom_id": {"type": "string", "pattern": CUSTOM_ID.pattern},
                        "params": ref("MessagesRequest"),
                    },
                    ["custom_id", "params"],
                    additionalProperties=False,
                ),
            }
        },
        ["requests"],
        additionalProperties=False,
    ),
    "MessageBatch": obj(
        {
            "id": STRING,
            "type": {"const": "message_batch"},
            "processing_status": {"enum": ["in_progress", "canceling", "ended"]},
            "request_counts": obj(
                {
                    name: INTEGER
                    for name in ("processing", "succeeded", "errored", "canceled", "expired")
                },
                ["processing", "succeeded", "errored", "canceled", "expired"],
            ),
            "ended_at": TIME,
            "created_at": {"type": "string", "format": "date-time"},
            "expires_at": {"type": "string", "format": "date-time"},
            "archived_at": TIME,
            "cancel_initiated_at": TIME,
            "results_url": nullable(STRING),
        },
        ["id", "type", "processing_status", "request_counts", "created_at", "expires_at"],
    ),
    "MessageBatchList": obj(
        {"data": {"type": "array", "items": ref("MessageBatch")}, **PAGE_IDS},
        ["data", "has_more"],
    ),
    "MessageBatchDeleted": obj(
        {"id": STRING, "type": {"const": "message_batch_deleted"}}, ["id", "type"]
    ),
}


def _v1(summary: str, answer: str | dict[str, Schema], **fields: object) -> Operation:
    content = json(answer) if isinstance(answer, str) else answer
    return Operation(summary, content, errors=V1_BATCH_ERRORS, **fields)  # type: ignore[arg-type]


_FILE = "/v1/files/{file_id}"
_BATCH = "/v1/batches/{batch_id}"
_MESSAGE_BATCH = "/v1/messages/batches/{batch_id}"
BATCH_OPERATIONS: dict[str, Operation] = {
    "POST /v1/files": _v1(
        "Upload a batch input file (JSONL)",
        "File",
        body={"multipart/form-data": "FileUpload"},
    ),
    "GET /v1/files": _v1("The key's files, newest first", "FileList", query=FileListQuery),
    f"GET {_FILE}": _v1("One of the key's files", "File"),
    f"DELETE {_FILE}": _v1("Delete one of the key's files", "FileDeleted"),
    f"GET {_FILE}/content": _v1(
        "A file's bytes (a batch's input, output or error JSONL)",
        {"application/octet-stream": BINARY},
    ),
    "POST /v1/batches": _v1(
        "Create a batch of an uploaded file, run by the gateway", "Batch", body=json(BatchCreate)
    ),
    "GET /v1/batches": _v1("The key's batches, newest first", "BatchList", query=BatchListQuery),
    f"GET {_BATCH}": _v1("One of the key's batches", "Batch"),
    f"POST {_BATCH}/cancel": _v1(
        "Cancel a batch: no line starts after it; answers already made are kept", "Batch"
    ),
    "POST /v1/messages/batches": _v1(
        "Create an Anthropic Message Batch, run by the gateway",
        "MessageBatch",
        body=json("MessageBatchCreate"),
    ),
    "GET /v1/messages/batches": _v1(
        "The key's message batches, newest first", "MessageBatchList", query=MessageBatchListQuery
    ),
    f"GET {_MESSAGE_BATCH}": _v1("One of the key's message batches", "MessageBatch"),
    f"DELETE {_MESSAGE_BATCH}": _v1(
        "Delete an ended message batch and its results", "MessageBatchDeleted"
    ),
    f"POST {_MESSAGE_BATCH}/cancel": _v1("Cancel a message batch", "MessageBatch"),
    f"GET {_MESSAGE_BATCH}/results": _v1(
        "An ended message batch's results, one JSON line per request",
        {"application/x-jsonl": {"type": "string"}},
    ),
    "GET /admin/batches": Operation(
        "Every key's batches, newest first (404: no batch has the id after names)",
        json("AdminBatchList"),
        query=AdminBatchQuery,
        errors=(400, 401, 403, 404, 429, 503),
    ),
    "GET /admin/batches/{batch_id}": Operation(
        "One batch, whichever key's", json("AdminBatch"), errors=(400, 401, 403, 404, 429, 503)
    ),
    "POST /admin/batches/{batch_id}/cancel": Operation(
        "Cancel a batch (operator)",
        json("AdminBatch"),
        errors=(400, 401, 403, 404, 409, 429, 503),
    ),
}
