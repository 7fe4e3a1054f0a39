"""OpenAI's Files API, for batches: ``POST /v1/files`` (``purpose=batch``, a JSONL file within
``SWITCHYARD_BATCH_MAX_FILE_BYTES``), ``GET /v1/files`` (newest first, ``after`` and ``limit``
as OpenAI pages them), ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content`` and ``DELETE
/v1/files/{id}``.

Files belong to the key that uploaded them (a batch's output and error files to the batch's
key): another key's file is a 404, as a file that does not exist. Bytes and records are in the
SQL store (``gateway/batches/store.py``), so every replica serves every file.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Literal, TypedDict

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.access.auth import Principal
from gateway.api.endpoint import Guard, endpoint
from gateway.api.http import json_response
from gateway.api.id_page import IdPage, id_page
from gateway.api.payloads import parse_query
from gateway.api.v1.batch_views import File, file_view
from gateway.batches.records import INPUT_PURPOSE, FilePurpose, FileRecord, new_file_id
from gateway.errors import InvalidRequest, NotFound, PayloadTooLarge, echo
from gateway.ledger.record import label_problem
from gateway.services import Services

# Room for the form's boundaries and part headers beside the file itself.
FORM_OVERHEAD = 64 * 1024
MAX_FILENAME = 200


class FileListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    purpose: FilePurpose | None = None
    limit: Annotated[int, Field(ge=1, le=10_000)] = 10_000
    after: (
        Annotated[str, Field(max_length=200, description="a file id: the page after it")] | None
    ) = None
    order: Literal["desc"] = "desc"


class FileList(IdPage):
    object: Literal["list"]
    data: list[File]


class FileDeleted(TypedDict):
    id: str
    object: Literal["file"]
    deleted: bool


async def owned_file(services: Services, principal: Principal, file_id: str) -> FileRecord:
    """The key's own file, else the 404 OpenAI gives for a file that does not exist."""
    record = await services.batches.store.file(file_id)
    if record is None or record.key_id != principal.key_id:
        raise NotFound(f"No such File object: {echo(file_id)}", param="id", code=None)
    return record


def _capped(request: Request, cap: int) -> Request:
    """``request`` whose body stops with a 413 past ``cap`` bytes (a chunked upload too)."""
    seen = 0

    async def receive() -> Any:
        nonlocal seen
        message = await request.receive()
        seen += len(message.get("body", b""))
        if seen > cap:
            raise PayloadTooLarge(f"the upload is larger than the limit of {cap} bytes")
        return message

    return Request(request.scope, receive)


async def _read_upload(request: Request, cap: int) -> tuple[str | None, UploadFile | None]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap + FORM_OVERHEAD:
        raise PayloadTooLarge(f"the file is larger than the limit of {cap} bytes")
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequest("upload the file as multipart/form-data", param="content-type")
    try:
        form = await _capped(request, cap + FORM_OVERHEAD).form(max_files=1, max_fields=8)
    except HTTPException as exc:  # the form parser's complaint about a malformed body
        raise InvalidRequest(f"the multipart body is malformed: {exc.detail}") from None
    purpose = form.get("purpose")
    upload = form.get("file")
    return (
        purpose if isinstance(purpose, str) else None,
        upload if isinstance(upload, UploadFile) else None,
    )


def check_jsonl(data: bytes) -> None:
    """A batch input file is UTF-8 JSONL: every non-empty line one JSON object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("the file must be UTF-8 text (JSONL)", param="file") from None
    count = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError:
            item = None
        if not isinstance(item, dict):
            raise InvalidRequest(f"line {number} of the file is not a JSON object", param="file")
        count += 1
    if count == 0:
        raise InvalidRequest("the file holds no lines", param="file")


async def create_file(request: Request, services: Services, principal: Principal) -> Response:
    """``POST /v1/files`` (multipart: ``purpose=batch`` and ``file``)."""
    cap = services.batches.settings.max_file_bytes
    purpose, upload = await _read_upload(request, cap)
    if purpose != INPUT_PURPOSE:
        raise InvalidRequest(
            f"purpose: only {INPUT_PURPOSE!r} files are taken here, not {echo(purpose)}",
            param="purpose",
        )
    if upload is None:
        raise InvalidRequest("file: the form has no file part", param="file")
    data = await upload.read()
    if len(data) > cap:
        raise PayloadTooLarge(f"the file is larger than the limit of {cap} bytes")
    filename = (upload.filename or "batch.jsonl")[:MAX_FILENAME]
    if label_problem(filename) is not None:
        raise InvalidRequest("file: the filename holds control characters", param="file")
    await asyncio.to_thread(check_jsonl, data)
    record = FileRecord(
        new_file_id(), principal.key_id, INPUT_PURPOSE, filename, len(data), int(time.time() * 1000)
    )
    await services.batches.store.add_file(record, data)
    return json_response(file_view(record))


async def list_files(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/files?purpose=&limit=&after=``: the key's files, newest first."""
    query = parse_query(FileListQuery, request)
    after = await owned_file(services, principal, query.after) if query.after else None
    page = await services.batches.store.files(
        principal.key_id, purpose=query.purpose, after=after, limit=query.limit
    )
    data = [file_view(record) for record in page.items]
    answer = FileList(object="list", data=data, **id_page(data, page.has_more))
    return json_response(answer)


async def get_file(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/files/{file_id}``"""
    record = await owned_file(services, principal, request.path_params["file_id"])
    return json_response(file_view(record))


async def file_content(request: Request, services: Services, principal: Principal) -> Response:
    """``GET /v1/files/{file_id}/content``: the file's bytes."""
    record = await owned_file(services, principal, request.path_params["file_id"])
    data = await services.batches.store.file_bytes(record.file_id)
    return Response(
        data,
        media_type="application/octet-stream",
        headers={"content-disposition": f'attachment; filename="{record.file_id}.jsonl"'},
    )


async def delete_file(request: Request, services: Services, principal: Principal) -> Response:
    """``DELETE /v1/files/{file_id}``; a batch's output stays until its own key deletes it."""
    record = await owned_file(services, principal, request.path_params["file_id"])
    deleted = await services.batches.store.delete_file(record.file_id)
    return json_response(FileDeleted(id=record.file_id, object="file", deleted=deleted))


routes = [
    Route("/v1/files", endpoint(create_file, Guard.API_KEY), methods=["POST"]),
    Route("/v1/files", endpoint(list_files, Guard.API_KEY), methods=["GET"]),
    Route("/v1/files/{file_id}", endpoint(get_file, Guard.API_KEY), methods=["GET"]),
    Route("/v1/files/{file_id}", endpoint(delete_file, Guard.API_KEY), methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", endpoint(file_content, Guard.API_KEY), methods=["GET"]),
]
