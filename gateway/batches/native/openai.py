"""OpenAI's Batch API for a ``batch: native`` provider of kind ``openai_compatible``.

Submit: the requests as a JSONL file (``POST {base_url}/files``, ``purpose=batch``; each line
``{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body"}``), then ``POST
{base_url}/batches`` with the gateway's own id in ``metadata`` (``switchyard_native_id``), so
a submission whose answer was lost is found again by listing the batches (``find``) instead of
being made twice. Poll ``GET {base_url}/batches/{id}``; once ended (``completed``, ``failed``,
``expired``, ``cancelled``) read ``GET {base_url}/files/{id}/content`` of its output and error
files. Cancel: ``POST {base_url}/batches/{id}/cancel``. Every call carries the provider's own
headers (its ``Authorization: Bearer`` key, its policy ``headers``) through its session.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from urllib.parse import quote

import orjson

from gateway.batches.native.calls import ProviderCalls
from gateway.batches.native.upstream import (
    NATIVE_ID_METADATA,
    NativeRequest,
    NativeResult,
    UpstreamState,
)

ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
# OpenAI's error codes of requests a batch never ran.
UNRUN = {"batch_expired": "expired", "batch_cancelled": "cancelled"}
LIST_PAGE = 100
# A batch found by ``find`` may have been created this long before the submission began
# (clocks of the gateway and the provider differ a little).
CLOCK_SLACK_MS = 5 * 60 * 1000


class OpenAiBatches(ProviderCalls):
    """``BatchApi`` over OpenAI's Files and Batch API."""

    async def submit(self, native_id: str, endpoint: str, requests: Sequence[NativeRequest]) -> str:
        lines = b"".join(
            orjson.dumps(
                {"custom_id": r.custom_id, "method": "POST", "url": endpoint, "body": r.body}
            )
            + b"\n"
            for r in requests
        )
        boundary = "switchyard-" + secrets.token_hex(12)
        form = _multipart(boundary, {"purpose": b"batch"}, ("file", f"{native_id}.jsonl", lines))
        headers = {**self.headers(), "content-type": f"multipart/form-data; boundary={boundary}"}
        reply = await self.provider.http.forward(self.url("/files"), form, headers)
        uploaded = self.json_object(reply.body)
        created = await self.post(
            "/batches",
            {
                "input_file_id": self.text(uploaded.get("id"), "file id"),
                "endpoint": endpoint,
                "completion_window": "24h",
                "metadata": {NATIVE_ID_METADATA: native_id},
            },
        )
        return self.text(created.get("id"), "batch id")

    async def find(self, native_id: str, since_ms: int) -> str | None:
        after: str | None = None
        while True:
            query = f"?limit={LIST_PAGE}" + (f"&after={quote(after, safe='')}" if after else "")
            page = await self.get_json("/batches" + query)
            items = [item for item in page.get("data") or [] if isinstance(item, dict)]
            for item in items:
                metadata = item.get("metadata")
                if isinstance(metadata, dict) and metadata.get(NATIVE_ID_METADATA) == native_id:
                    return self.text(item.get("id"), "batch id")
            # Newest first: past the submission's start, no older batch can be it.
            created = [item.get("created_at") for item in items]
            oldest = min((c for c in created if isinstance(c, int)), default=None)
            if not page.get("has_more") or not items:
                return None
            if oldest is not None and oldest * 1000 < since_ms - CLOCK_SLACK_MS:
                return None
            after = items[-1].get("id")
            if not isinstance(after, str):
                return None

    async def poll(self, upstream_id: str) -> UpstreamState:
        data = await self.get_json(f"/batches/{quote(upstream_id, safe='')}")
        status = str(data.get("status") or "")
        output, errors = data.get("output_file_id"), data.get("error_file_id")
        return UpstreamState(
            upstream_id,
            status,
            status in ENDED,
            output_file_id=output if isinstance(output, str) else None,
            error_file_id=errors if isinstance(errors, str) else None,
        )

    async def results(self, state: UpstreamState) -> list[NativeResult]:
        found: list[NativeResult] = []
        for file_id in (state.output_file_id, state.error_file_id):
            if file_id is None:
                continue
            path = f"/files/{quote(file_id, safe='')}/content"
            content = await self.get(path, cap=self.result_cap)
            for raw in content.splitlines():
                result = self._result(raw)
                if result is not None:
                    found.append(result)
        return found

    def _result(self, raw: bytes) -> NativeResult | None:
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None  # a blank or torn line: its request gets the gateway's own error
        if not isinstance(item, dict) or not isinstance(item.get("custom_id"), str):
            return None
        custom_id = item["custom_id"]
        response = item.get("response")
        if isinstance(response, dict) and isinstance(response.get("status_code"), int):
            body = orjson.dumps(response.get("body"))
            return NativeResult(custom_id, "answered", response["status_code"], body)
        error = item.get("error") if isinstance(item.get("error"), dict) else {}
        unrun = UNRUN.get(str(error.get("code")))
        if unrun is not None:
            return NativeResult(custom_id, unrun)  # type: ignore[arg-type]
        # A request the provider failed without an HTTP answer: its error, as a 500 would be.
        body = orjson.dumps({"error": {"message": str(error.get("message") or "failed"), **error}})
        return NativeResult(custom_id, "answered", 500, body)

    async def cancel(self, upstream_id: str) -> None:
        await self.post(f"/batches/{quote(upstream_id, safe='')}/cancel", {})


def _multipart(boundary: str, fields: dict[str, bytes], file: tuple[str, str, bytes]) -> bytes:
    """A ``multipart/form-data`` body: text fields, then one file."""
    parts = [
        b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n'
        % (boundary.encode(), name.encode(), value)
        for name, value in fields.items()
    ]
    name, filename, data = file
    parts.append(
        b'--%s\r\nContent-Disposition: form-data; name="%s"; filename="%s"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n%s\r\n"
        % (boundary.encode(), name.encode(), filename.encode(), data)
    )
    return b"".join(parts) + b"--%s--\r\n" % boundary.encode()
