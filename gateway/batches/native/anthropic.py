"""Anthropic's Message Batches for a ``batch: native`` provider of kind ``anthropic``.

Submit: ``POST {base_url}/messages/batches`` with ``requests: [{custom_id, params}]``. Poll
``GET {base_url}/messages/batches/{id}`` until its ``processing_status`` is ``ended``, then read
its ``results_url`` (JSONL: ``succeeded`` with the message, ``errored`` with Anthropic's error
envelope, ``canceled``, ``expired``). The provider's key goes only to the provider: a
``results_url`` elsewhere than its base URL's origin is not followed, the results are read
from ``{base_url}/messages/batches/{id}/results`` instead. Cancel: ``POST .../cancel``. Every
call carries its ``x-api-key`` and ``anthropic-version`` (and its policy ``headers``).

Message Batches keep no metadata, so an upstream batch whose creation answer was lost (the
replica died in between) cannot be found again: ``find`` says None (docs/batches.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote, urlsplit

import orjson

from gateway.batches.native.calls import ProviderCalls
from gateway.batches.native.upstream import NativeRequest, NativeResult, UpstreamState
from gateway.formats.anthropic_messages import parse_error

UNRUN = {"canceled": "cancelled", "expired": "expired"}


class AnthropicBatches(ProviderCalls):
    """``BatchApi`` over Anthropic's Message Batches."""

    def _batch(self, upstream_id: str) -> str:
        return f"/messages/batches/{quote(upstream_id, safe='')}"

    async def submit(self, native_id: str, endpoint: str, requests: Sequence[NativeRequest]) -> str:
        items = [{"custom_id": r.custom_id, "params": r.body} for r in requests]
        created = await self.post("/messages/batches", {"requests": items})
        return self.text(created.get("id"), "message batch id")

    async def find(self, native_id: str, since_ms: int) -> str | None:
        return None  # no metadata to know it by

    async def poll(self, upstream_id: str) -> UpstreamState:
        data = await self.get_json(self._batch(upstream_id))
        status = str(data.get("processing_status") or "")
        url = data.get("results_url")
        return UpstreamState(
            upstream_id,
            status,
            status == "ended",
            results_url=url if isinstance(url, str) else None,
        )

    async def results(self, state: UpstreamState) -> list[NativeResult]:
        url = state.results_url
        if url is None or _origin(url) != _origin(self.provider.base_url):
            url = self._batch(state.upstream_id) + "/results"
        content = await self.get(url, cap=self.result_cap)
        found: list[NativeResult] = []
        for raw in content.splitlines():
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # a blank or torn line: its request gets the gateway's own error
            result = item.get("result") if isinstance(item, dict) else None
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            if not isinstance(result, dict) or not isinstance(custom_id, str):
                continue
            kind = result.get("type")
            if kind == "succeeded":
                found.append(
                    NativeResult(custom_id, "answered", 200, orjson.dumps(result.get("message")))
                )
            elif kind in UNRUN:
                found.append(NativeResult(custom_id, UNRUN[kind]))  # type: ignore[arg-type]
            else:  # errored: its status is its error type's
                body = orjson.dumps(result.get("error"))
                found.append(
                    NativeResult(custom_id, "answered", parse_error(None, body).status, body)
                )
        return found

    async def cancel(self, upstream_id: str) -> None:
        await self.post(self._batch(upstream_id) + "/cancel", {})


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, parts.netloc
