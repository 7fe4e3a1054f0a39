"""What the OpenAPI document says of the batch operations (``api/v1/files.py``,
``api/v1/batches.py``, ``api/v1/message_batches.py``, ``api/admin/batches.py``): their
entries, as in ``operations.py``. ``document.py`` adds them to the others.

Their answers are the ``TypedDict`` each builder returns (``api/v1/batch_views.py`` and the
list and delete answers beside their handlers), whose schemas are generated. Two bodies are
written out here, as in ``unmodelled.py``: the multipart upload of ``POST /v1/files``, which
Starlette's form parser reads and the handler checks part by part, and the body of ``POST
/v1/messages/batches``, which the handler checks in code (``batches/jsonl.py``
``anthropic_lines``): its refusals name the first problem in the order of its checks (an
unknown field, then each request in turn: an object, its ``custom_id``, a duplicate, its
``params``, an unknown field) under ``param: requests``, where a model's conversion reports
the first in the order of the client's keys under the field's own path.
"""

from __future__ import annotations

from gateway.api.admin.batches import AdminBatch, AdminBatchList, AdminBatchQuery
from gateway.api.openapi.models import Schema, ref
from gateway.api.openapi.operations import Operation, json
from gateway.api.openapi.unmodelled import obj
from gateway.api.v1.batch_views import Batch, File, MessageBatch
from gateway.api.v1.batches import BatchCreate, BatchList, BatchListQuery
from gateway.api.v1.files import FileDeleted, FileList, FileListQuery
from gateway.api.v1.message_batches import (
    MessageBatchDeleted,
    MessageBatchList,
    MessageBatchListQuery,
)
from gateway.batches.jsonl import CUSTOM_ID

V1_BATCH_ERRORS = (400, 401, 404, 409, 503)
BINARY = {"type": "string", "format": "binary"}

BATCH_SCHEMAS: dict[str, Schema] = {
    "FileUpload": obj(
        {"purpose": {"enum": ["batch"]}, "file": BINARY},
        ["purpose", "file"],
        description="multipart/form-data: a JSONL file of a batch's requests",
    ),
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
}


def _v1(summary: str, answer: type | dict[str, Schema], **fields: object) -> Operation:
    content = json(answer) if isinstance(answer, type) else answer
    return Operation(summary, content, errors=V1_BATCH_ERRORS, **fields)  # type: ignore[arg-type]


_FILE = "/v1/files/{file_id}"
_BATCH = "/v1/batches/{batch_id}"
_MESSAGE_BATCH = "/v1/messages/batches/{batch_id}"
BATCH_OPERATIONS: dict[str, Operation] = {
    "POST /v1/files": _v1(
        "Upload a batch input file (JSONL)",
        File,
        body={"multipart/form-data": "FileUpload"},
    ),
    "GET /v1/files": _v1("The key's files, newest first", FileList, query=FileListQuery),
    f"GET {_FILE}": _v1("One of the key's files", File),
    f"DELETE {_FILE}": _v1("Delete one of the key's files", FileDeleted),
    f"GET {_FILE}/content": _v1(
        "A file's bytes (a batch's input, output or error JSONL)",
        {"application/octet-stream": BINARY},
    ),
    "POST /v1/batches": _v1(
        "Create a batch of an uploaded file, run by the gateway", Batch, body=json(BatchCreate)
    ),
    "GET /v1/batches": _v1("The key's batches, newest first", BatchList, query=BatchListQuery),
    f"GET {_BATCH}": _v1("One of the key's batches", Batch),
    f"POST {_BATCH}/cancel": _v1(
        "Cancel a batch: no line starts after it; answers already made are kept", Batch
    ),
    "POST /v1/messages/batches": _v1(
        "Create an Anthropic Message Batch, run by the gateway",
        MessageBatch,
        body=json("MessageBatchCreate"),
    ),
    "GET /v1/messages/batches": _v1(
        "The key's message batches, newest first", MessageBatchList, query=MessageBatchListQuery
    ),
    f"GET {_MESSAGE_BATCH}": _v1("One of the key's message batches", MessageBatch),
    f"DELETE {_MESSAGE_BATCH}": _v1(
        "Delete an ended message batch and its results", MessageBatchDeleted
    ),
    f"POST {_MESSAGE_BATCH}/cancel": _v1("Cancel a message batch", MessageBatch),
    f"GET {_MESSAGE_BATCH}/results": _v1(
        "An ended message batch's results, one JSON line per request",
        {"application/x-jsonl": {"type": "string"}},
    ),
    "GET /admin/batches": Operation(
        "Every key's batches, newest first (404: no batch has the id after names)",
        json(AdminBatchList),
        query=AdminBatchQuery,
        errors=(400, 401, 403, 404, 429, 503),
    ),
    "GET /admin/batches/{batch_id}": Operation(
        "One batch, whichever key's", json(AdminBatch), errors=(400, 401, 403, 404, 429, 503)
    ),
    "POST /admin/batches/{batch_id}/cancel": Operation(
        "Cancel a batch (operator)",
        json(AdminBatch),
        errors=(400, 401, 403, 404, 409, 429, 503),
    ),
}
