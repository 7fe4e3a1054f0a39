"""The head of a ``multipart/form-data`` upload, and the upload streamed on with its model
replaced.

Routing needs the ``model`` field before the file: ``read_head`` reads the body only as far as
the first file part (the SDKs send their text fields first), at most ``MAX_HEAD_BYTES``, and
keeps the text fields it passed. ``Upload.body(model)`` then yields those bytes with the
model's value replaced, followed by the rest of the client's body as it arrives, counted
against the upload cap: the file itself is never buffered. The rest can be read once only, so
``started`` says whether an attempt has begun sending it (after that, no other candidate can
be tried with it).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import KW_ONLY, dataclass, field

from gateway.errors import InvalidRequest, PayloadTooLarge

MAX_HEAD_BYTES = 256 * 1024
_BOUNDARY = re.compile(r'boundary="?([^";]{1,200})"?', re.IGNORECASE)
_NAME = re.compile(rb'\bname="([^"]*)"', re.IGNORECASE)
_FILENAME = re.compile(rb"\bfilename\*?=", re.IGNORECASE)


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a multipart/form-data body, or a 400 naming the header."""
    if not content_type or not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequest(
            "this endpoint takes a multipart/form-data upload", param="content-type"
        )
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise InvalidRequest("the multipart content-type has no boundary", param="content-type")
    return match.group(1).encode("latin-1", "replace")


@dataclass
class FormHead:
    """The body's bytes up to the first file part, and the text fields in them."""

    data: bytes
    fields: dict[str, str] = field(default_factory=dict)
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # field -> value bytes
    has_file: bool = False
    complete: bool = False  # the body's closing delimiter was read


def parse_head(data: bytes, boundary: bytes) -> FormHead | None:
    """The head if ``data`` holds it all (up to a file part, or the whole body), else None."""
    delimiter = b"--" + boundary
    position = data.find(delimiter)
    if position < 0:
        return None
    head = FormHead(data)
    while True:
        line_end = data.find(b"\r\n", position)
        if line_end < 0:
            return None
        if data[position + len(delimiter) : position + len(delimiter) + 2] == b"--":
            head.complete = True
            return head
        headers_end = data.find(b"\r\n\r\n", line_end)
        if headers_end < 0:
            return None
        headers = data[line_end + 2 : headers_end]
        if _FILENAME.search(headers):
            head.has_file = True
            return head
        value_start = headers_end + 4
        value_end = data.find(b"\r\n" + delimiter, value_start)
        if value_end < 0:
            return None
        name = _NAME.search(headers)
        if name is not None:
            key = name.group(1).decode("utf-8", "replace")
            head.fields[key] = data[value_start:value_end].decode("utf-8", "replace")
            head.spans[key] = (value_start, value_end)
        position = value_end + 2


@dataclass(eq=False)
class Upload:
    """A multipart body on its way upstream: the head read, the rest still with the client."""

    head: FormHead
    rest: AsyncIterator[bytes] = field(repr=False)  # read once, by ``body``
    _: KW_ONLY
    cap: int
    declared_length: int | None
    started: bool = field(default=False, init=False)
    too_large: bool = field(default=False, init=False)

    def length(self, model: str) -> int | None:
        """The body's length with ``model`` in it (None: the client sent it chunked)."""
        if self.declared_length is None:
            return None
        start, end = self.head.spans["model"]
        return self.declared_length + len(model.encode()) - (end - start)

    async def body(self, model: str) -> AsyncIterator[bytes]:
        self.started = True
        start, end = self.head.spans["model"]
        data = self.head.data
        size = len(data)
        yield data[:start] + model.encode() + data[end:]
        async for chunk in self.rest:
            size += len(chunk)
            if size > self.cap:
                self.too_large = True
                raise PayloadTooLarge(f"the upload is larger than the limit of {self.cap} bytes")
            yield chunk


async def read_head(
    chunks: AsyncIterator[bytes], boundary: bytes, cap: int
) -> tuple[FormHead, AsyncIterator[bytes]]:
    """Read ``chunks`` until the head is whole; the head and the iterator of the rest."""
    data = b""
    async for chunk in chunks:
        data += chunk
        head = parse_head(data, boundary)
        if head is not None:
            return head, chunks
        if len(data) > min(MAX_HEAD_BYTES, cap):
            raise InvalidRequest(
                "the form's text fields (model first) must come before the file, within "
                f"{MAX_HEAD_BYTES} bytes",
                param="model",
            )
    head = parse_head(data, boundary)
    if head is None:
        raise InvalidRequest("the multipart body is cut short or malformed")
    return head, chunks
