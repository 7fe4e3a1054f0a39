"""Every dashboard page in headless Chromium at 1400 and 420 px wide (screenshots under
test-artifacts/, to look at), and what issue 27 saw go wrong on them:

- a refused form (RPM -5) comes back to the keys page, its error shown there, not to a page
  titled "Switchyard usage" offering "Back to the last 14 days";
- Rotate and Revoke ask first (a confirmation page; rotation has a grace field) and keep CSRF;
  a rotation form sent twice rotates once and is audited once;
- chart axes: distinct tick labels (the error rate repeated "0.00%"), "$" on the spend axis;
- a key's budget reads "$50.00 / month", not "$50.0 / month";
- the audit page: times as UTC dates, the actor said once, details as fields, no raw floats
  and no JSON blobs;
- at 420 px the header still shows "Audit log" and "Sign out".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from chromium import CHROMIUM, DevTools, chromium_page
from gateway_runner import ADMIN_KEY, GatewayThread, RunningGateway, make_settings
from replica_load import CHAT

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
WIDTHS = (1400, 420)

# Where the header's links and button are, against the window: each must be drawn inside it.
HEADER_ITEMS = """(() => {
  const items = Array.from(document.querySelectorAll('header nav a, header button'));
  return items.map(e => { const r = e.getBoundingClientRect();
    return {text: e.textContent.trim(), left: r.left, right: r.right, width: r.width,
            visible: r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== 'hidden'};
  });
})()"""
PAGE_WIDTH = "document.documentElement.scrollWidth"


async def _shoot(tools: DevTools, name: str) -> dict[int, list[dict]]:
    """Screenshots of the page at each width; the header's items as drawn at each."""
    drawn: dict[int, list[dict]] = {}
    for width in WIDTHS:
        await tools.call(
            "Emulation.setDeviceMetricsOverride",
            width=width, height=1400, deviceScaleFactor=1, mobile=False,
        )  # fmt: skip
        await tools.wait_for("document.readyState === 'complete'")
        drawn[width] = await tools.evaluate(HEADER_ITEMS)
        for item in drawn[width]:
            assert item["visible"] and item["left"] >= 0 and item["right"] <= width, (
                name, width, item,
            )  # fmt: skip
        # Nothing runs off the side of the window (a wide table scrolls inside its card).
        assert await tools.evaluate(PAGE_WIDTH) <= width, (name, width)
        await tools.screenshot(ARTIFACTS / f"dashboard-{name}-{width}.png")
    await tools.call(
        "Emulation.setDeviceMetricsOverride",
        width=WIDTHS[0], height=1400, deviceScaleFactor=1, mobile=False,
    )  # fmt: skip
    return drawn


def _traffic(gateway: RunningGateway) -> None:
    key = gateway.create_key(name="traffic")[1]
    for _ in range(3):
        answer = httpx.post(
            gateway.base_url + "/v1/chat/completions",
            json=CHAT,
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    gateway.wait_exported()


def _chat_status(base_url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(base_url + "/v1/models", headers=headers, timeout=10).status_code


async def _text(tools: DevTools, selector: str = "body") -> str:
    return await tools.evaluate(f"document.querySelector({selector!r}).innerText")


@needs_chromium
async def test_every_dashboard_page_reads_well_wide_and_narrow(
    tmp_path: Path, fake_policy: Path, clean_redis: str
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with GatewayThread(make_settings(tmp_path / "gw", fake_policy, clean_redis)) as gateway:
        _traffic(gateway)
        base = gateway.base_url
        async with chromium_page(tmp_path / "chromium") as tools:
            await tools.open(base + "/admin/ui", "document.querySelector('input[name=key]')")
            await _shoot(tools, "login")
            await tools.submit(
                "form[action='/admin/ui/login']",
                {"key": ADMIN_KEY},
                "document.querySelectorAll('svg rect').length > 0",
            )

            # The usage page: every axis's ticks are distinct; money ticks carry "$".
            axes = await tools.evaluate(
                "Object.fromEntries(Array.from(document.querySelectorAll('svg[data-chart]'))"
                ".map(s => [s.dataset.chart, Array.from(s.querySelectorAll('text[text-anchor=end]'))"
                ".filter(t => t.previousElementSibling && t.previousElementSibling.tagName === 'line')"
                ".map(t => t.textContent)]))"
            )
            assert axes["error-rate"] == ["0.00%", "0.01%", "0.02%"], axes
            for chart, ticks in axes.items():
                assert len(ticks) == len(set(ticks)) == 3 or not ticks, (chart, ticks)
                if chart.startswith("spend"):
                    assert all(tick.startswith("$") for tick in ticks), (chart, ticks)
            drawn = await _shoot(tools, "usage")
            assert {"Audit log", "Sign out"} <= {i["text"] for i in drawn[420]}, drawn[420]

            # A refused form comes back to the keys page with the error there, values kept.
            await tools.open(base + "/admin/ui/keys", "document.querySelector('[data-form]')")
            await tools.submit(
                "form[data-form=create-key]",
                {"name": "negative", "rpm": "-5"},
                "document.querySelector('[role=alert]')",
            )
            assert await tools.evaluate("document.title") == "Switchyard keys and teams"
            alert = await tools.evaluate(
                "[document.querySelector('[role=alert]').textContent,"
                " document.querySelector('[role=alert]').dataset.param]"
            )
            assert alert[1] == "rpm" and "rpm" in alert[0], alert
            body = await _text(tools)
            assert "Back to the last 14 days" not in body and "Switchyard usage" not in body
            typed = await tools.evaluate(
                "[document.querySelector('form[data-form=create-key] [name=name]').value,"
                " document.querySelector('form[data-form=create-key] [name=rpm]').value]"
            )
            assert typed == ["negative", "-5"]
            await _shoot(tools, "keys-refused")

            # A key with a budget: "$50.00 / month".
            await tools.submit(
                "form[data-form=create-key]",
                {"name": "budgeted", "rpm": "", "budget_usd": "50", "budget_period": "month"},
                "document.querySelector('[data-secret]')",
            )
            first = await tools.evaluate("document.querySelector('[data-secret]').textContent")
            key_id = await tools.evaluate("document.querySelector('[data-key-id]').dataset.keyId")
            await _shoot(tools, "key-created")
            row = f"tr[data-key-id='{key_id}']"
            await tools.open(base + "/admin/ui/keys", f'document.querySelector("{row}")')
            cells = await tools.evaluate(
                f'Array.from(document.querySelectorAll("{row} td")).map(c => c.textContent.trim())'
            )
            assert "$50.00 / month" in cells, cells
            await _shoot(tools, "keys")

            # Rotate asks first; nothing changes until the confirmation is sent.
            await tools.click(
                f"{row} a[data-action=rotate]", "document.querySelector('[data-confirm]')"
            )
            assert await tools.evaluate(
                "!!document.querySelector('[data-form=rotate] [name=csrf]')"
            )
            assert _chat_status(base, first) == 200  # only asked so far
            await _shoot(tools, "confirm-rotate")
            fields = await tools.evaluate(
                "Object.fromEntries(new FormData(document.querySelector('form[data-form=rotate]')))"
            )
            assert set(fields) == {"csrf", "confirm", "idempotency_key", "grace_seconds"}
            await tools.submit(
                "form[data-form=rotate]",
                {"grace_seconds": "3600"},
                "document.querySelector('[data-secret]')",
            )
            second = await tools.evaluate("document.querySelector('[data-secret]').textContent")
            assert second != first and _chat_status(base, second) == 200
            assert _chat_status(base, first) == 200  # the grace period from the form
            assert "keeps working until" in await _text(tools, "[data-grace]")
            await _shoot(tools, "key-rotated")

            # The same confirmation sent again (a double click, a resent form): the same
            # answer, one rotation, one audit entry.
            resent = {**fields, "grace_seconds": "3600"}
            await tools.evaluate(
                "(() => { window.__before = document.body; const f = document.createElement('form');"
                f" f.method = 'post'; f.action = '/admin/ui/keys/{key_id}/rotate';"
                f" for (const [k, v] of Object.entries({json.dumps(resent)})) {{"
                " const i = document.createElement('input'); i.type = 'hidden'; i.name = k;"
                " i.value = v; f.appendChild(i); }"
                " document.body.appendChild(f); f.submit(); return true; })()"
            )
            await tools.wait_for(
                "document.body !== window.__before && document.readyState === 'complete'"
                " && !!document.querySelector('[data-secret]')"
            )
            assert await tools.evaluate("document.querySelector('[data-secret]').textContent") == (
                second
            )

            # Revoke asks first too; a bad grace value is asked again with the error.
            await tools.open(base + "/admin/ui/keys", f'document.querySelector("{row}")')
            await tools.click(
                f"{row} a[data-action=rotate]", "document.querySelector('[data-confirm]')"
            )
            await tools.submit(
                "form[data-form=rotate]",
                {"grace_seconds": "soon"},
                "document.querySelector('[data-confirm] [role=alert]')",
            )
            assert "grace_seconds" in await _text(tools, "[role=alert]")
            await _shoot(tools, "confirm-rotate-refused")
            await tools.open(base + "/admin/ui/keys", f'document.querySelector("{row}")')
            await tools.click(
                f"{row} a[data-action=revoke]", "document.querySelector('[data-confirm]')"
            )
            assert _chat_status(base, second) == 200
            await _shoot(tools, "confirm-revoke")
            await tools.submit(
                "form[data-form=revoke]",
                {},
                f"document.querySelector(\"{row}\")?.dataset.status === 'revoked'",
            )
            assert _chat_status(base, second) == 401

            # The audit page: one key.rotate for the key; readable times, actor and details.
            await tools.open(
                base + "/admin/ui/audit", "document.querySelector('table[data-table=audit]')"
            )
            rows = await tools.evaluate(
                "Array.from(document.querySelectorAll('tr[data-action]'))"
                ".map(r => [r.dataset.action, r.dataset.target, r.querySelector('[data-actor]').textContent])"
            )
            mine = [r for r in rows if r[1] == f"key:{key_id}"]
            assert [r[0] for r in mine] == ["key.revoke", "key.rotate", "key.create"], rows
            assert {r[2] for r in mine} == {"bootstrap admin key"}
            audit_text = await _text(tools, "table[data-table=audit]")
            assert not re.search(r"\b1\d{9}\.\d+", audit_text), audit_text  # no Unix floats
            assert "{" not in audit_text and "bootstrap bootstrap" not in audit_text
            assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", audit_text)
            status = await tools.evaluate(
                f"document.querySelector(\"tr[data-action='key.revoke'][data-target='key:{key_id}']"
                ' [data-field=status]").textContent'
            )
            assert status == "active → revoked"
            budget = await tools.evaluate(
                f"document.querySelector(\"tr[data-action='key.create'][data-target='key:{key_id}']"
                ' [data-field=budget_usd]").textContent'
            )
            assert budget == "$50.00"
            await _shoot(tools, "audit")

            # An error page titled as the page it came from, linking back to it.
            await tools.open(
                base + "/admin/ui?from=someday", "document.querySelector('[role=alert]')"
            )
            assert await tools.evaluate("document.title") == "Switchyard usage"
            await _shoot(tools, "usage-refused")


@pytest.mark.parametrize("peak", [0, 1, 2, 3, 7, 49, 51, 730, 1001, 123_456_789])
def test_axis_ticks_are_distinct_and_reach_the_peak(peak: int) -> None:
    from gateway.api.dashboard.view import axis_ticks, format_usd

    ticks = axis_ticks(peak)
    assert ticks[0] == 0 and ticks[-1] >= peak and len(set(ticks)) == 3
    assert len({f"{t / 100:.2f}%" for t in ticks}) == 3  # the error-rate axis' labels
    assert len({format_usd(t) for t in ticks}) == 3


def test_money_reads_as_dollars_and_cents() -> None:
    from gateway.money import format_usd_money

    assert format_usd_money(50_000_000_000) == "$50.00"
    assert format_usd_money(125_000_000) == "$0.125"
    assert format_usd_money(1) == "$0.000000001"
    assert format_usd_money(-1_500_000_000) == "-$1.50"
