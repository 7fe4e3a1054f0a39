"""The dashboard of a running gateway in headless Chromium, driven over the DevTools protocol:
log in through the form with the admin key, then the page's numbers match /admin/usage."""

from __future__ import annotations

import asyncio
import base64
import itertools
import re
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from counting_provider import CountingProvider
from gateway_runner import ADMIN_KEY
from usage_workload import Workload, metered_gateway, run_workload, wait_for_events

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class DevTools:
    """The few DevTools calls this test needs, over one page's websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.ws.receive_json(), 30)
            if message.get("id") == call_id:
                assert "error" not in message, message
                return message["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await self.evaluate(expression):
            assert asyncio.get_running_loop().time() < deadline, f"timed out: {expression}"
            await asyncio.sleep(0.1)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
async def test_dashboard_of_the_running_gateway_in_chromium(
    clean_redis: str, provider: CountingProvider, counting_policy: Path, tmp_path: Path
) -> None:
    gateway = metered_gateway(clean_redis, tmp_path / "gw", counting_policy).start()
    browser = None
    try:
        _, key = gateway.create_key(name="dash", team="web")
        await run_workload([gateway.url], [key], Workload.mixed(30, "d"))
        with gateway.admin() as admin:
            wait_for_events(admin, 30)
            report = admin.get("/admin/usage", params={"group_by": "model"}).json()

        browser = await asyncio.create_subprocess_exec(
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1600,2400",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--remote-debugging-port=0",
            "about:blank",
            stderr=asyncio.subprocess.PIPE,
        )
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
                await tools.call("Page.navigate", url=gateway.url + "/admin/ui")
                await tools.wait_for("!!document.querySelector('input[name=key]')")
                await tools.evaluate(
                    f"document.querySelector('input[name=key]').value = {ADMIN_KEY!r};"
                    "document.querySelector('form').submit(); true"
                )
                await tools.wait_for("document.querySelectorAll('svg rect').length > 0")
                await tools.wait_for("document.readyState === 'complete'")
                text = await tools.evaluate("document.body.innerText")
                spend_bars = await tools.evaluate(
                    "Array.from(document.querySelectorAll('svg[data-chart] rect[data-value]'))"
                    ".map(r => [r.closest('svg').dataset.chart, Number(r.dataset.value)])"
                )
                shot = await tools.call("Page.captureScreenshot", format="png")
        artifacts = REPO_ROOT / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        screenshot = artifacts / "dashboard-e2e.png"
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        print(f"\ndashboard screenshot (running gateway): {screenshot}")

        assert screenshot.stat().st_size > 10_000
        for row in report["data"]:
            assert row["model"] in text  # every model of the report is on the page

        def total(chart: str) -> int:
            return round(sum(value for name, value in spend_bars if name == chart))

        # The bars carry the ledger's own integers: nano-dollars and tokens, over the month.
        assert total("spend-by-model") == report["totals"]["cost_nanos"]
        assert total("spend-by-key") == report["totals"]["cost_nanos"]
        assert total("tokens-by-model") == report["totals"]["total_tokens"]
    finally:
        if browser is not None and browser.returncode is None:
            browser.kill()
            await browser.wait()
        gateway.stop()
