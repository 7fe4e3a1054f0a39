"""Requests to a gateway that run on their own thread while the test looks at the engine."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx


class InFlight:
    """One request on its own thread, recording what came back and when; ``disconnect()``
    closes its connection at the next line it reads."""

    def __init__(self, url: str, api_key: str, body: dict[str, Any], task: str | None = None):
        self.url, self.body = url, body
        self.headers = {"Authorization": f"Bearer {api_key}"}
        if task is not None:
            self.headers["X-Task-Type"] = task
        self.first_chunk = threading.Event()
        self.stop = threading.Event()
        self.status: int | None = None
        self.text = ""
        self.ended_at: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with (
            httpx.Client(timeout=60) as client,
            client.stream("POST", self.url, json=self.body, headers=self.headers) as reply,
        ):
            self.status = reply.status_code
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    self.first_chunk.set()
                if self.stop.is_set():
                    return  # closes the connection mid-stream
                self.text += line + "\n"
        self.ended_at = time.monotonic()

    def disconnect(self) -> None:
        self.stop.set()


def held_stream(
    base_url: str, api_key: str, messages: list[dict[str, Any]], max_tokens: int = 20000
) -> InFlight:
    """A stream of the local model that goes on (EOS ignored) until told to disconnect."""
    body = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    return InFlight(base_url + "/chat/completions", api_key, body)
