"""Headless Chromium for the dashboard tests, driven over the DevTools protocol: navigate,
fill and submit forms as a person would, read the DOM, take a screenshot.

``chromium_page(profile_dir)`` starts Chromium (``--remote-debugging-port=0``), connects to its
first page and yields a ``DevTools``; the browser is stopped when the block ends. Cookies work
as in any browser: the dashboard's Secure cookies are kept on http://127.0.0.1 (a secure
context), so the login form's CSRF cookie and the session cookie flow as they would for a user.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The dashboard has drawn its charts: what a logged-in page waits for by default.
CHARTS_DRAWN = "document.querySelectorAll('svg rect').length > 0"


# What Chromium answers an evaluation that a navigation overtook: the page is between two
# documents, which for a wait means "not yet".
NAVIGATING = ("navigated or closed", "context was destroyed", "Cannot find context")


class DevToolsError(AssertionError):
    """A DevTools call answered with an error."""


class DevTools:
    """The few DevTools calls the tests need, over one page's websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), 30)
            if message.get("id") == call_id:
                if "error" in message:
                    raise DevToolsError(message)
                return message["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await self._holds(expression):
            assert asyncio.get_running_loop().time() < deadline, f"timed out: {expression}"
            await asyncio.sleep(0.1)

    async def _holds(self, expression: str) -> bool:
        try:
            return bool(await self.evaluate(expression))
        except DevToolsError as exc:
            if any(words in str(exc) for words in NAVIGATING):
                return False  # asked mid-navigation (a loaded box makes it likelier)
            raise

    async def open(self, url: str, ready: str) -> None:
        """Navigate and wait until ``ready`` (a JS expression) holds."""
        await self.call("Page.navigate", url=url)
        await self.wait_for(f"document.readyState === 'complete' && !!({ready})")

    async def submit(self, form: str, fields: dict[str, str], ready: str) -> None:
        """Fill the form matching CSS selector ``form`` as a person would, submit it, and wait
        for the next page to satisfy ``ready``."""
        selector = json.dumps(form)
        filled = "".join(
            f"f.querySelector('[name={name}]').value = {json.dumps(value)};"
            for name, value in fields.items()
        )
        await self.evaluate(
            f"(() => {{ window.__before = document.body; const f = document.querySelector"
            f"({selector}); {filled} f.submit(); return true; }})()"
        )
        await self.wait_for(
            f"document.body !== window.__before && document.readyState === 'complete'"
            f" && !!({ready})"
        )

    async def click(self, selector: str, ready: str) -> None:
        """Follow the link (or press the button) matching ``selector`` as a person would, and
        wait for the next page to satisfy ``ready``."""
        await self.evaluate(
            f"(() => {{ window.__before = document.body; "
            f"document.querySelector({json.dumps(selector)}).click(); return true; }})()"
        )
        await self.wait_for(
            f"document.body !== window.__before && document.readyState === 'complete'"
            f" && !!({ready})"
        )

    async def log_in(self, base_url: str, key: str, ready: str = CHARTS_DRAWN) -> None:
        """Open the dashboard of the gateway at ``base_url``, log in with ``key`` through its
        form as a person would, and wait for the dashboard to satisfy ``ready``."""
        await self.open(base_url + "/admin/ui", "document.querySelector('input[name=key]')")
        await self.submit("form[action='/admin/ui/login']", {"key": key}, ready)

    async def html(self) -> str:
        return await self.evaluate("document.documentElement.outerHTML")

    async def screenshot(self, path: Path) -> None:
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def chromium_page(profile: Path, size: str = "1600,2400") -> AsyncIterator[DevTools]:
    assert CHROMIUM is not None, "chromium is not installed (apt-get install chromium)"
    browser = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={size}",
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        "about:blank",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert browser.stderr is not None
        endpoint = None
        while endpoint is None:
            line = (await asyncio.wait_for(browser.stderr.readline(), 60)).decode()
            assert line, "chromium exited before DevTools listened"
            found = re.search(r"DevTools listening on ws://([^/]+)/", line)
            endpoint = found.group(1) if found else None
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://{endpoint}/json/list") as listing:
                pages = [t for t in await listing.json() if t["type"] == "page"]
            async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                tools = DevTools(ws)
                await tools.call("Page.enable")
                yield tools
    finally:
        if browser.returncode is None:
            browser.terminate()
            await browser.wait()
