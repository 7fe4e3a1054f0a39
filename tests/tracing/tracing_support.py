"""Helpers of the tracing tests (imported by file name: this folder is on sys.path)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.tracing import Tracing

# make_tracing(capture_prompts=False, **OTEL_VARIABLES) -> Tracing
MakeTracing = Callable[..., Tracing]


async def flushed(tracing: Any) -> None:
    """Make a tracing export what it has queued, off the event loop (the SDK call blocks)."""
    flush = getattr(tracing, "force_flush", None)
    if flush is not None:
        assert await asyncio.to_thread(flush)
