"""A stream's answer: the provider's events relayed to the client as they arrive.

Each event goes through the relay (``formats/relay.py``: untouched when the provider speaks the
client's format, translated otherwise) and on at once, those that arrived together in one
write (a burst, or a busy gateway that found several in one read); what the relay holds back
for the end (``[DONE]``, the format's last event) is the reply's last piece, sent once the usage
record is durable. A failure after the first byte (the upstream cut the stream, sent an error
event, or an answer the client's format cannot show) ends the stream with the client format's
error event, never a clean end, and counts against the provider's breaker; a client that leaves
gives the provider's slot back without a verdict. Only a clean end is a success for the
breaker and the latency average, and only then is the stream kept by the response cache.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.api.envelopes import stream_error
from gateway.api.v1.request_end import Reply
from gateway.cache.request import StreamKeeper
from gateway.errors import UpstreamError
from gateway.formats.errors import FormatError
from gateway.formats.internal import FormatName, Usage
from gateway.formats.relay import StreamRelay
from gateway.metering.accounting import Accounting
from gateway.metrics import Metrics
from gateway.providers.attempt import OpenedStream, end_stream_try
from gateway.providers.base import PhasedStream, broken_answer
from gateway.routing.dispatch import DispatchResult
from gateway.server.exchange import CLIENT_GONE
from gateway.tracing import RequestTrace

NOTHING = Usage(0, 0)
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class StreamReply(Reply):
    """The served candidate's stream, relayed to the client; its status is 499 (the client
    went away) until the stream ends."""

    relayed = True

    def __init__(
        self,
        headers: dict[str, str],
        *,
        result: DispatchResult[OpenedStream],
        relay: StreamRelay,
        client: FormatName,
        metered: bool,
        books: Accounting,
        keeper: StreamKeeper | None,
        metrics: Metrics,
        trace: RequestTrace,
        tracing: bool,
    ) -> None:
        super().__init__(CLIENT_GONE, {**headers, **SSE_HEADERS}, media_type="text/event-stream")
        self.result = result
        self.opened = result.value
        self.relay = relay
        self.client = client
        self.metered = metered
        self.books = books
        self.keeper = keeper
        self.metrics = metrics
        self.trace = trace
        self.tracing = tracing

    async def pieces(self) -> AsyncIterator[bytes]:
        served, relay, keeper = self.result.candidate, self.relay, self.keeper
        # Tracing on: the span reads the chunks' ids, finish reasons (and text, when captured).
        observe = self.tracing and self.opened.target == "openai_chat"
        try:
            try:
                async for batch in self.opened.events.batches():
                    self._first_token(served.model)
                    outs: list[bytes] = []
                    try:
                        for data in batch:
                            if observe and data != b"[DONE]":
                                self.trace.observe_chunk(_json_or_none(data))
                            out = relay.feed(data)
                            if keeper is not None:
                                keeper.add(relay, out)
                            if relay.finished:
                                self.last = out
                                break
                            if out:
                                outs.append(out)
                    except FormatError:
                        if outs:  # what came before the broken event still goes out
                            yield b"".join(outs)
                        raise
                    if outs:
                        yield outs[0] if len(outs) == 1 else b"".join(outs)
                    if relay.finished:
                        break
                else:
                    self.last = relay.close()
                    if relay.error is not None:
                        raise UpstreamError(
                            f"upstream provider {served.provider} ended the stream early",
                            kind="protocol",
                            provider=served.provider,
                        )
            except FormatError as exc:  # a translated stream that breaks its own format
                raise broken_answer(exc, served.provider) from None
            if relay.error is not None:
                raise self.opened.provider.stream_error(relay.error)
            self.status = 200
            self.result.succeeded()  # a clean end: only now a success for breaker and latency
            if keeper is not None:
                keeper.keep(served, relay.usage)
        except UpstreamError as exc:
            self.status = exc.status
            self.error = exc.message
            self.metrics.upstream_errors.labels(served.provider, exc.kind).inc()
            # Too late to fall back, but the breaker must see it: a provider that always cuts
            # its streams would otherwise stay in rotation.
            self.result.failed()
            self.last = stream_error(self.client, relay, exc)

    def _first_token(self, model: str) -> None:
        books = self.books
        if books.ttft_ms is None:
            ttft_s = time.perf_counter() - books.started
            books.ttft_ms = int(ttft_s * 1000)
            self.metrics.ttft.labels(model).observe(ttft_s)

    def close(self) -> None:
        """However it ended (done, cut, or the client gone): what the stream showed of its
        usage noted, upstream closed, the provider slot given back (no verdict when the
        client went away)."""
        relay, opened = self.relay, self.opened
        self.books.streamed_chunks = relay.produced
        if relay.usage is not None:
            self.usage = relay.usage if self.metered else NOTHING
        if self.tracing and isinstance(opened.events, PhasedStream):
            opened.tried.engine_phases(opened.events.phases())
        end_stream_try(opened.tried, self.status)
        if self.keeper is not None and self.status != 200:
            self.keeper.incomplete()
        opened.events.close()
        self.result.release()


def _json_or_none(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
