"""The dashboard's charts fill their cards, measured in headless Chromium: at a wide window
(two cards a row) and a narrow one (one a row), each chart's drawing is as wide as its card's
content box, its grid reaches the card's right edge and today's bars sit at the right, not in
the left half (issue 18: "the bars sit in the left half")."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from chromium import CHROMIUM, chromium_page
from gateway_runner import ADMIN_KEY, GatewayThread, make_settings
from replica_load import CHAT

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)

MEASURE = """Array.from(document.querySelectorAll('section.chart')).map(card => {
  const style = getComputedStyle(card), box = card.getBoundingClientRect();
  const left = box.left + card.clientLeft + parseFloat(style.paddingLeft);
  const right = left + card.clientWidth - parseFloat(style.paddingLeft)
    - parseFloat(style.paddingRight);
  const svg = card.querySelector('svg').getBoundingClientRect();
  const edge = (selector) => {
    const found = Array.from(card.querySelectorAll(selector));
    return found.length ? Math.max(...found.map(e => e.getBoundingClientRect().right)) : null;
  };
  return {id: card.id, left, right, svgLeft: svg.left, svgRight: svg.right,
          grid: edge('svg line'), bars: edge('svg rect'), cardWidth: box.width};
})"""


async def test_charts_use_their_cards_full_width(
    tmp_path: Path, fake_policy: Path, clean_redis: str
) -> None:
    with GatewayThread(make_settings(tmp_path / "gw", fake_policy, clean_redis)) as gateway:
        key = gateway.create_key(name="wide")[1]
        for _ in range(3):
            answer = httpx.post(
                gateway.base_url + "/v1/chat/completions",
                json=CHAT,
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            )
            assert answer.status_code == 200
        gateway.wait_exported()  # the page reads the usage store, a moment behind
        async with chromium_page(tmp_path / "chromium") as tools:
            await tools.open(
                gateway.base_url + "/admin/ui", "document.querySelector('input[name=key]')"
            )
            await tools.submit(
                "form[action='/admin/ui/login']",
                {"key": ADMIN_KEY},
                "document.querySelectorAll('svg rect').length > 0",
            )
            layouts = {}
            for width in (1600, 900):
                await tools.call(
                    "Emulation.setDeviceMetricsOverride",
                    width=width, height=2400, deviceScaleFactor=1, mobile=False,
                )  # fmt: skip
                layouts[width] = await tools.evaluate(MEASURE)

    for width, cards in layouts.items():
        # spend and tokens by model and key, top keys, tags and end users, error rate
        assert len(cards) == 8, cards
        per_row = len({round(card["left"]) for card in cards})
        assert per_row == (2 if width == 1600 else 1)
        for card in cards:
            inner = card["right"] - card["left"]
            assert abs(card["svgLeft"] - card["left"]) <= 1, card
            assert abs(card["svgRight"] - card["right"]) <= 1, card  # the full content box
            if card["grid"] is not None:  # a chart per day: its grid reaches the right edge
                assert card["right"] - card["grid"] <= 0.02 * inner, card
            if card["bars"] is None:
                continue  # the error-rate chart has no bars: no request failed
            # A day chart: today's bar is the range's last, at the right edge. The top-keys
            # chart: the largest bar spans all but the room of its value label. Before the fix
            # both ended near 45 % of a wide card.
            reach = 0.9 if card["grid"] is not None else 0.8
            assert card["bars"] - card["left"] >= reach * inner, card
