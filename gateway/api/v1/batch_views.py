"""Files and batches as each API shows them: OpenAI's ``file`` and ``batch`` objects,
Anthropic's ``message_batch``.

Times are whole epoch seconds for OpenAI and RFC 3339 text for Anthropic. OpenAI's
``request_counts`` count answered lines (``completed``: a 2xx answer, ``failed``: any other);
Anthropic's count every request as ``processing`` until the batch has ended, then by result,
as Anthropic does. Anthropic's ``processing_status`` is ``in_progress`` until a cancel
(``canceling``) and ``ended`` once final.

Each view returns the ``TypedDict`` declared beside it, from which the OpenAPI document's
schema of the answer is generated (``api/openapi/models.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal, TypedDict

import msgspec
import orjson

from gateway.batches.jsonl import BatchErrors
from gateway.batches.records import (
    BatchRecord,
    BatchStatus,
    CompletionWindow,
    FilePurpose,
    FileRecord,
    LineCounts,
)

# An instant as RFC 3339 text (Anthropic's times).
Rfc3339 = Annotated[str, msgspec.Meta(extra_json_schema={"format": "date-time"})]
ProcessingStatus = Literal["in_progress", "canceling", "ended"]


class File(TypedDict):
    """OpenAI's ``file`` object."""

    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["processed"]
    status_details: None
    expires_at: None


class BatchRequestCounts(TypedDict):
    total: int
    completed: int
    failed: int


class Batch(TypedDict):
    """OpenAI's ``batch`` object."""

    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str | None
    completion_window: CompletionWindow
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchRequestCounts
    metadata: dict[str, str] | None


class MessageBatchRequestCounts(TypedDict):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(TypedDict):
    """Anthropic's ``message_batch`` object."""

    id: str
    type: Literal["message_batch"]
    processing_status: ProcessingStatus
    request_counts: MessageBatchRequestCounts
    ended_at: Rfc3339 | None
    created_at: Rfc3339
    expires_at: Rfc3339
    archived_at: Rfc3339 | None
    cancel_initiated_at: Rfc3339 | None
    results_url: str | None


def _seconds(ms: int | None) -> int | None:
    return None if ms is None else ms // 1000


def file_view(record: FileRecord) -> File:
    return {
        "id": record.file_id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_ms // 1000,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def batch_view(record: BatchRecord, counts: LineCounts) -> Batch:
    """The OpenAI ``batch`` object."""
    final = record.final
    answered = counts if not final else LineCounts(record.total, record.completed, record.failed)
    errors = orjson.loads(record.errors_json) if record.errors_json else None
    return {
        "id": record.batch_id,
        "object": "batch",
        "endpoint": record.endpoint,
        "errors": errors,
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": record.status,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "created_at": record.created_ms // 1000,
        "in_progress_at": _seconds(record.in_progress_ms),
        "expires_at": record.expires_ms // 1000,
        "finalizing_at": _seconds(record.finalizing_ms),
        "completed_at": _seconds(record.completed_ms),
        "failed_at": _seconds(record.failed_ms),
        "expired_at": _seconds(record.expired_ms),
        "cancelling_at": _seconds(record.cancelling_ms),
        "cancelled_at": _seconds(record.cancelled_ms),
        "request_counts": {
            "total": answered.total,
            "completed": answered.completed,
            "failed": answered.failed,
        },
        "metadata": orjson.loads(record.metadata_json) if record.metadata_json else None,
    }


def _rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _rfc3339_or_none(ms: int | None) -> str | None:
    return None if ms is None else _rfc3339(ms)


def processing_status(record: BatchRecord) -> ProcessingStatus:
    if record.final:
        return "ended"
    return "canceling" if record.status == "cancelling" else "in_progress"


def message_batch_view(record: BatchRecord, counts: LineCounts, results_url: str) -> MessageBatch:
    """The Anthropic ``message_batch`` object; ``results_url`` once it has ended."""
    ended = record.final
    ended_ms = record.completed_ms or record.cancelled_ms or record.expired_ms or record.failed_ms
    request_counts: MessageBatchRequestCounts = {
        "processing": 0 if ended else counts.total,
        "succeeded": counts.completed if ended else 0,
        "errored": counts.failed if ended else 0,
        "canceled": counts.cancelled if ended else 0,
        "expired": counts.expired if ended else 0,
    }
    return {
        "id": record.batch_id,
        "type": "message_batch",
        "processing_status": processing_status(record),
        "request_counts": request_counts,
        "ended_at": _rfc3339_or_none(ended_ms) if ended else None,
        "created_at": _rfc3339(record.created_ms),
        "expires_at": _rfc3339(record.expires_ms),
        "archived_at": None,
        "cancel_initiated_at": _rfc3339_or_none(record.cancelling_ms),
        "results_url": results_url if ended else None,
    }
