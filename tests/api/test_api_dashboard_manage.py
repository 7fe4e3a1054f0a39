"""The dashboard's keys and teams page and its audit page, in headless Chromium against a
running gateway: an operator signs in with a named token, creates a team and a key of it (the
key shown once, and it works), rotates and revokes it through the page's forms; a form whose
CSRF token was tampered with is refused; the bootstrap admin then reads the rotation in the
audit page."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from chromium import CHROMIUM, DevTools, chromium_page
from gateway_runner import ADMIN_KEY, GatewayThread, make_settings

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)
REPO_ROOT = Path(__file__).resolve().parents[2]


async def _secret_on_page(tools: DevTools) -> str:
    return await tools.evaluate("document.querySelector('[data-secret]').textContent")


def _models(base_url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(base_url + "/v1/models", headers=headers, timeout=10).status_code


async def test_an_operator_manages_keys_and_teams_from_the_page(
    tmp_path: Path, fake_policy: Path, clean_redis: str
) -> None:
    with GatewayThread(make_settings(tmp_path / "gw", fake_policy, clean_redis)) as gateway:
        with gateway.admin() as admin:
            created = admin.post("/admin/tokens", json={"name": "pat", "role": "operator"})
        operator = created.json()["token"]
        base = gateway.base_url
        artifacts = REPO_ROOT / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        async with chromium_page(tmp_path / "chromium") as tools:
            await tools.open(base + "/admin/ui", "document.querySelector('input[name=key]')")
            await tools.submit(
                "form[action='/admin/ui/login']",
                {"key": operator},
                "document.querySelector('nav.who')",
            )
            assert await tools.evaluate("document.querySelector('nav.who').dataset.role") == (
                "operator"
            )
            await tools.open(base + "/admin/ui/keys", "document.querySelector('[data-form]')")
            assert not await tools.evaluate(
                "!!document.querySelector('a[href=\"/admin/ui/audit\"]')"
            )
            await tools.submit(
                "form[data-form=create-team]",
                {"id": "web", "rpm": "50", "budget_day": "5"},
                "document.querySelector('tr[data-team-id=web]')",
            )
            await tools.submit(
                "form[data-form=create-key]",
                {"name": "from-chromium", "team": "web"},
                "document.querySelector('[data-secret]')",
            )
            first = await _secret_on_page(tools)
            key_id = await tools.evaluate("document.querySelector('[data-key-id]').dataset.keyId")
            assert first.startswith(f"sk-sy-{key_id}-") and _models(base, first) == 200

            await tools.open(
                base + "/admin/ui/keys", f"document.querySelector('tr[data-key-id=\"{key_id}\"]')"
            )
            page_text = await tools.evaluate("document.body.innerText")
            assert first not in page_text  # shown once, never again
            row = f"tr[data-key-id='{key_id}']"
            confirm = "document.querySelector('form[data-form=rotate]')"
            await tools.click(f"{row} a[data-action=rotate]", confirm)
            await tools.submit(
                "form[data-form=rotate]", {}, "document.querySelector('[data-secret]')"
            )
            second = await _secret_on_page(tools)
            assert second != first and _models(base, second) == 200
            assert _models(base, first) == 401  # no grace from the page: the old one is gone

            # A tampered CSRF token: refused, the key stays active.
            revoke = base + f"/admin/ui/keys/{key_id}/revoke"
            await tools.open(revoke, "document.querySelector('form[data-form=revoke]')")
            await tools.submit(
                "form[data-form=revoke]",
                {"csrf": "tampered"},
                "document.querySelector('[role=alert]')",
            )
            refusal = await tools.evaluate("document.querySelector('[role=alert]').textContent")
            assert "CSRF" in refusal and _models(base, second) == 200

            await tools.open(revoke, "document.querySelector('form[data-form=revoke]')")
            await tools.submit(
                "form[data-form=revoke]",
                {},
                f'document.querySelector("{row}") && '
                f"document.querySelector(\"{row}\").dataset.status === 'revoked'",
            )
            assert _models(base, second) == 401
            await tools.screenshot(artifacts / "dashboard-keys.png")

            # The bootstrap admin reads the audit log in the page.
            await tools.submit(
                "form[action='/admin/ui/logout']", {}, "document.querySelector('input[name=key]')"
            )
            await tools.submit(
                "form[action='/admin/ui/login']",
                {"key": ADMIN_KEY},
                "document.querySelector('nav.who')",
            )
            await tools.open(
                base + "/admin/ui/audit", "document.querySelector('table[data-table=audit]')"
            )
            rows = await tools.evaluate(
                "Array.from(document.querySelectorAll('tr[data-action]'))"
                ".map(r => [r.dataset.action, r.dataset.actorName, r.dataset.target])"
            )
            await tools.screenshot(artifacts / "dashboard-audit.png")
            page_text = await tools.evaluate("document.body.innerText")
        assert ["key.rotate", "pat", f"key:{key_id}"] in rows
        assert ["key.revoke", "pat", f"key:{key_id}"] in rows
        assert ["team.create", "pat", "team:web"] in rows
        assert ["dashboard.login", "pat", "dashboard"] in rows
        assert first not in page_text and second not in page_text and operator not in page_text
