"""What the batch store keeps: files, batches and their lines, as plain frozen records.

A batch belongs to the API key that made it and speaks one API: ``openai`` (the Batch API:
an input file of JSONL lines, an output and an error file) or ``anthropic`` (Message Batches:
requests sent inline, results as JSONL). Its ``status`` is OpenAI's word for where it stands
(Anthropic's ``processing_status`` is drawn from it, ``views.py``):

``validating`` → ``in_progress`` → ``finalizing`` → ``completed``; ``validating`` → ``failed``
(the input is refused); ``in_progress`` → ``expired`` (the completion window passed);
``validating`` or ``in_progress`` → ``cancelling`` → ``cancelled``. Every final status keeps
what was answered.

A line's ``state``: ``pending`` (nobody holds it), ``leased`` (a replica runs it, until
``lease_until_ms`` unless renewed), ``native`` (sent, or to be sent, to a provider's own batch
API: ``batches/native``), ``done`` (answered: ``status_code`` and ``response``), or closed
unanswered: ``cancelled``, ``expired``.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Literal

Api = Literal["openai", "anthropic"]
BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
FINAL_STATUSES: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
# Statuses a runner still has work in (validate, run lines, close).
OPEN_STATUSES: tuple[str, ...] = ("validating", "in_progress", "finalizing", "cancelling")
CANCELLABLE: frozenset[str] = frozenset({"validating", "in_progress"})
LineState = Literal["pending", "leased", "native", "done", "cancelled", "expired"]
UNANSWERED: tuple[str, ...] = ("pending", "leased", "native")

# OpenAI and Anthropic both run a batch within 24 hours; the only window either accepts.
CompletionWindow = Literal["24h"]
COMPLETION_WINDOW: CompletionWindow = "24h"
WINDOW_MS = 24 * 3600 * 1000

# File purposes: what a client uploads, and what the gateway writes for a batch.
FilePurpose = Literal["batch", "batch_output"]
INPUT_PURPOSE: FilePurpose = "batch"
OUTPUT_PURPOSE: FilePurpose = "batch_output"


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def new_batch_id(api: Api) -> str:
    return ("msgbatch_" if api == "anthropic" else "batch_") + secrets.token_hex(16)


def derived_file_id(batch_id: str, role: str) -> str:
    """A batch's output or error file id: the same whichever replica closes the batch, so a
    close that is redone after a crash writes the same files again, not new ones."""
    return "file-" + hashlib.sha256(f"{batch_id}:{role}".encode()).hexdigest()[:24]


def line_request_id(batch_id: str, index: int) -> str:
    """The ``batch_req_...`` id of a line's answer (stable: a line answered again after a
    replica died keeps it)."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{index}".encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class FileRecord:
    file_id: str
    key_id: str
    purpose: FilePurpose
    filename: str
    bytes: int
    created_ms: int


@dataclass(frozen=True, slots=True)
class BatchRecord:
    batch_id: str
    key_id: str
    api: Api
    endpoint: str  # the /v1 path each line goes to
    input_file_id: str | None
    completion_window: CompletionWindow
    metadata_json: str | None
    status: BatchStatus
    created_ms: int
    expires_ms: int
    in_progress_ms: int | None = None
    finalizing_ms: int | None = None
    completed_ms: int | None = None
    failed_ms: int | None = None
    expired_ms: int | None = None
    cancelling_ms: int | None = None
    cancelled_ms: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors_json: str | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    # The replica closing the batch (rendering its files), and until when it may.
    closer: str | None = None
    closer_until_ms: int | None = None
    # When its lines were sorted into native ones (a provider's batch API) and the others, and
    # the replica sorting them (until when); none of its lines is claimed before.
    routed_ms: int | None = None
    router: str | None = None
    router_until_ms: int | None = None

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


@dataclass(frozen=True, slots=True)
class LineCounts:
    """A batch's lines by outcome: ``completed`` answered 2xx, ``failed`` answered otherwise,
    ``cancelled`` and ``expired`` closed unanswered, ``open`` not answered yet."""

    total: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    expired: int = 0

    @property
    def open(self) -> int:
        return self.total - self.completed - self.failed - self.cancelled - self.expired


@dataclass(frozen=True, slots=True)
class NewLine:
    """A line of a batch being started: its place, its ``custom_id`` and body (JSON text)."""

    index: int
    custom_id: str
    body: str


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    batch_id: str
    index: int
    custom_id: str
    body: str
    tries: int


@dataclass(frozen=True, slots=True)
class LineAnswer:
    """What a line's request got: its HTTP status and the body (JSON text) in the batch's API
    format (an answer, or an error envelope)."""

    status_code: int
    response: str


@dataclass(frozen=True, slots=True)
class StoredLine:
    """A line as the close of its batch reads it."""

    index: int
    custom_id: str
    state: LineState
    status_code: int | None
    response: str | None
    request_id: str | None
