"""The dashboard of a running gateway in headless Chromium, driven over the DevTools protocol
(``tests/support/chromium.py``): log in through the form with the admin key, then the page's
numbers match /admin/usage."""

from __future__ import annotations

from pathlib import Path

import pytest
from chromium import CHROMIUM, chromium_page
from gateway_runner import ADMIN_KEY, GatewayProcess
from usage_workload import Workload, run_workload, wait_for_events

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
async def test_dashboard_of_the_running_gateway_in_chromium(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    _, key = gateway.create_key(name="dash", team="web")
    await run_workload([gateway.url], [key], Workload.mixed(30, "d"))
    with gateway.admin() as admin:
        wait_for_events(admin, 30)
        report = admin.get("/admin/usage", params={"group_by": "model"}).json()

    async with chromium_page(tmp_path / "chromium") as tools:
        await tools.log_in(gateway.url, ADMIN_KEY)
        text = await tools.evaluate("document.body.innerText")
        spend_bars = await tools.evaluate(
            "Array.from(document.querySelectorAll('svg[data-chart] rect[data-value]'))"
            ".map(r => [r.closest('svg').dataset.chart, Number(r.dataset.value)])"
        )
        artifacts = REPO_ROOT / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        screenshot = artifacts / "dashboard-e2e.png"
        await tools.screenshot(screenshot)
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
