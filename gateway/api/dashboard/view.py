"""What the ``/admin/ui`` dashboard shows, and the Jinja renderer that draws it.

``build_view`` turns the report cells of a date range into charts already laid out in SVG
coordinates, and tables; the templates (``templates/``, autoescaped) draw them with no
JavaScript. Every chart element carries its exact number in ``data-value`` and a ``<title>``
tooltip, and the same numbers appear in the tables below, so the page is readable without
JavaScript and checkable by a test. The HTTP side (login, sessions) is ``home.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import jinja2
from starlette.responses import HTMLResponse, Response

from gateway.api.pages import PageLink, secured
from gateway.metering.reports import (
    Cell,
    Totals,
    days_between,
    group_cells,
    report_row,
    total_of,
)
from gateway.money import NANOS_PER_USD, format_usd_money, stored_usd_to_nanos

TOP_KEYS = 10
KEY_SERIES = 8  # keys drawn individually in the spend-by-key chart; the rest is "other"
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
SHORT_NAME = 22  # characters of a key name that fit beside a ranked bar
# One row of a table: what it is about (a model, day, tag or end user) and its totals.
Row = tuple[str, Totals]


def format_usd(nanos: int) -> str:
    """Exact, from the integer nano-dollars: ``$1,234.50``, ``$0.001692``, ``$0.0000005``."""
    if nanos == 0:
        return "$0"
    whole, fraction = divmod(nanos, NANOS_PER_USD)
    digits = f"{fraction:09d}".rstrip("0").ljust(2, "0")
    return f"${whole:,}.{digits}"


def format_count(value: int) -> str:
    return f"{value:,}"


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    color: str
    series: str
    day: str
    value: int
    label: str  # the value, formatted
    tooltip: str
    name: str = ""  # the series as people read it (a key's name beside its id)


@dataclass(frozen=True)
class Chart:
    """A bar chart already laid out in SVG coordinates."""

    chart_id: str
    title: str
    unit: str
    width: int
    height: int
    bars: list[Bar]
    x_labels: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    legend: list[tuple[str, str]] = field(default_factory=list)


def stacked_day_chart(
    chart_id: str,
    title: str,
    unit: str,
    days: Sequence[date],
    values: Mapping[str, Mapping[str, int]],
    fmt: Callable[[int], str],
    names: Mapping[str, str] | None = None,
) -> Chart:
    """One stacked bar per day; ``values[series][iso_day]`` are integers (n$ or tokens);
    ``names`` label series in the legend and tooltips (default: the series itself)."""
    names = names or {}
    width, height, left, bottom, top = 760, 240, 80, 28, 10
    plot_w, plot_h = width - left - 10, height - bottom - top
    series = list(values)
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}
    day_totals = [sum(values[s].get(d.isoformat(), 0) for s in series) for d in days]
    ticks = axis_ticks(max(day_totals, default=0))
    peak = ticks[-1]  # the axis' top: bars are drawn against the tick values
    slot = plot_w / max(len(days), 1)
    bars: list[Bar] = []
    for index, day in enumerate(days):
        iso = day.isoformat()
        y = top + plot_h
        for name in series:
            value = values[name].get(iso, 0)
            if value <= 0:
                continue
            bar_h = plot_h * value / peak
            y -= bar_h
            bars.append(
                Bar(
                    x=round(left + index * slot + slot * 0.15, 2),
                    y=round(y, 2),
                    width=round(slot * 0.7, 2),
                    height=round(bar_h, 2),
                    color=colors[name],
                    series=name,
                    day=iso,
                    value=value,
                    label=fmt(value),
                    tooltip=f"{names.get(name, name)} on {iso}: {fmt(value)}",
                    name=names.get(name, name),
                )
            )
    label_every = max(1, len(days) // 10)
    x_labels = [
        (round(left + i * slot + slot / 2, 2), d.strftime("%m-%d"))
        for i, d in enumerate(days)
        if i % label_every == 0
    ]
    y_ticks = [(round(top + plot_h * (1 - tick / peak), 2), fmt(tick)) for tick in ticks]
    return Chart(
        chart_id, title, unit, width, height, bars, x_labels, y_ticks,
        [(colors[name], names.get(name, name)) for name in series],
    )  # fmt: skip


def axis_ticks(peak: int) -> list[int]:
    """Three distinct whole ticks from 0 whose step is 1, 2 or 5 times a power of ten and
    whose top reaches ``peak``: 0 / 1 / 2 for a peak of 1 (never "0.00%" twice), 0 / 500 /
    1,000 for 730. Whole units: a chart's values are integers (n$, tokens, basis points)."""
    step = 1
    while 2 * step < peak:
        for factor in (2, 5 / 2, 2):  # 1 -> 2 -> 5 -> 10 ...
            step = int(step * factor)
            if 2 * step >= peak:
                break
    return [0, step, 2 * step]


def ranked_chart(
    chart_id: str,
    title: str,
    unit: str,
    ranked: Sequence[tuple[str, int]],
    fmt: Callable[[int], str],
    names: Mapping[str, str] | None = None,
) -> Chart:
    """Horizontal bars, largest first (top keys by spend); ``names`` as in
    ``stacked_day_chart``."""
    names = names or {}
    row_h, left, width = 26, 170, 760
    height = max(row_h * len(ranked) + 10, 40)
    peak = max((value for _, value in ranked), default=0) or 1
    bars = [
        Bar(
            x=left,
            y=5 + i * row_h,
            width=round((width - left - 110) * value / peak, 2),
            height=row_h - 8,
            color=PALETTE[0],
            series=name,
            day="",
            value=value,
            label=fmt(value),
            tooltip=f"{names.get(name, name)}: {fmt(value)}",
            name=names.get(name, name),
        )
        for i, (name, value) in enumerate(ranked)
    ]
    return Chart(chart_id, title, unit, width, height, bars, [], [])


def rate_chart(days: Sequence[date], by_day: Mapping[str, Totals]) -> Chart:
    """Error rate per day in basis points of a percent (value = errors per 10,000 requests)."""
    rates = {
        "error rate": {
            d.isoformat(): round(10_000 * t.errors / t.requests)
            for d in days
            if (t := by_day.get(d.isoformat())) and t.requests
        }
    }
    chart = stacked_day_chart(
        "error-rate", "Error rate per day", "errors per 10,000 requests", days, rates,
        lambda v: f"{v / 100:.2f}%",
    )  # fmt: skip
    return chart


@dataclass
class DashboardView:
    """Everything the template shows, computed from the report cells of one date range."""

    start: date
    end: date
    total: Totals
    charts: list[Chart]
    by_model: list[Row]
    by_day: list[Row]
    keys: list[dict[str, Any]]
    # Spend by tag and by end user ("" = requests without one), largest first.
    by_tag: list[Row] = field(default_factory=list)
    by_user: list[Row] = field(default_factory=list)


def key_names(key_list: Sequence[Mapping[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """How charts name keys: ``name (id)`` in legends and tooltips, and the name alone (cut
    to fit) beside a ranked bar; a key without a name is its id."""
    full: dict[str, str] = {}
    short: dict[str, str] = {}
    for entry in key_list:
        key_id, name = str(entry.get("id", "")), str(entry.get("name") or "")
        if name:
            full[key_id] = f"{name} ({key_id})"
            short[key_id] = name if len(name) <= SHORT_NAME else name[: SHORT_NAME - 1] + "…"
    return full, short


def build_view(
    start: date,
    end: date,
    cells: Sequence[Cell],
    key_list: Sequence[Mapping[str, Any]],
    by_tag: Sequence[Row] = (),
    by_user: Sequence[Row] = (),
) -> DashboardView:
    days = days_between(start, end)
    names, short_names = key_names(key_list)
    models = sorted(group_cells(cells, "model").items(), key=lambda kv: (-kv[1].cost_nanos, kv[0]))
    by_key = sorted(group_cells(cells, "key").items(), key=lambda kv: (-kv[1].cost_nanos, kv[0]))
    by_day = group_cells(cells, "day")

    def per_day(dimension: str, metric: Callable[[Totals], int]) -> dict[str, dict[str, int]]:
        series: dict[str, dict[str, int]] = {}
        for cell in cells:
            name = cell.dimension(dimension)
            day_values = series.setdefault(name, {})
            iso = cell.day.isoformat()
            day_values[iso] = day_values.get(iso, 0) + metric(cell.totals)
        return series

    spend_by_model = per_day("model", lambda t: t.cost_nanos)
    tokens_by_model = per_day("model", lambda t: t.total_tokens)
    spend_by_key_all = per_day("key", lambda t: t.cost_nanos)
    # Order series by total spend so colours and stacking match the tables.
    spend_by_model = {m: spend_by_model[m] for m, _ in models}
    tokens_by_model = {m: tokens_by_model[m] for m, _ in models}
    tokens_by_key_all = per_day("key", lambda t: t.total_tokens)

    def top_keys_and_other(all_keys: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
        series: dict[str, dict[str, int]] = {}
        for index, (key_id, _) in enumerate(by_key):
            merged = series.setdefault(key_id if index < KEY_SERIES else "other keys", {})
            for iso, value in all_keys[key_id].items():
                merged[iso] = merged.get(iso, 0) + value
        return series

    spend_by_key = top_keys_and_other(spend_by_key_all)
    tokens_by_key = top_keys_and_other(tokens_by_key_all)

    charts = [
        stacked_day_chart("spend-by-model", "Spend per day by model", "n$", days, spend_by_model, format_usd),
        stacked_day_chart("tokens-by-model", "Tokens per day by model", "tokens", days, tokens_by_model, format_count),
        stacked_day_chart("spend-by-key", "Spend per day by key", "n$", days, spend_by_key, format_usd, names),
        stacked_day_chart("tokens-by-key", "Tokens per day by key", "tokens", days, tokens_by_key, format_count, names),
        ranked_chart("top-keys", "Top keys by spend", "n$", [(k, t.cost_nanos) for k, t in by_key[:TOP_KEYS]], format_usd, short_names),
        ranked_chart("top-tags", "Top tags by spend", "n$", [(v or "(untagged)", t.cost_nanos) for v, t in by_tag[:TOP_KEYS]], format_usd),
        ranked_chart("top-users", "Top end users by spend", "n$", [(v or "(no user)", t.cost_nanos) for v, t in by_user[:TOP_KEYS]], format_usd),
        rate_chart(days, by_day),
    ]  # fmt: skip
    spend = dict(by_key)
    listed = {str(entry.get("id")) for entry in key_list}
    keys = [
        {
            "id": str(entry.get("id", "")),
            "name": str(entry.get("name") or ""),
            "team": str(entry.get("team") or ""),
            "status": str(entry.get("status") or "unknown"),
            "totals": spend.get(str(entry.get("id")), Totals()),
        }
        for entry in key_list
    ]
    # Keys with usage that the key store no longer lists (deleted) still show their spend.
    keys += [
        {"id": k, "name": "", "team": "", "status": "unlisted", "totals": t}
        for k, t in by_key
        if k not in listed
    ]
    keys.sort(key=lambda row: (-row["totals"].cost_nanos, row["id"]))
    return DashboardView(
        start=start,
        end=end,
        total=total_of(cells),
        charts=charts,
        by_model=models,
        by_day=[(d.isoformat(), by_day.get(d.isoformat(), Totals())) for d in days],
        keys=keys,
        by_tag=list(by_tag),
        by_user=list(by_user),
    )


class DashboardRenderer:
    """Owns the Jinja environment (autoescaping on) for the dashboard templates."""

    def __init__(self, template_dir: Path | None = None) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(template_dir or Path(__file__).parent / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["usd"] = format_usd
        # A key's budget is stored as USD: ``$50.00``, never ``$50.0``.
        self.env.filters["usd_amount"] = lambda usd: format_usd_money(stored_usd_to_nanos(usd))
        self.env.filters["count"] = format_count
        self.env.filters["report_row"] = report_row  # the row the usage API shows

    def render(self, template: str, **context: Any) -> str:
        return self.env.get_template(template).render(**context)


USAGE_PAGE = PageLink("/admin/ui", "Back to the last 14 days", "Switchyard usage")
KEYS_PAGE = PageLink("/admin/ui/keys", "Back to keys and teams", "Switchyard keys and teams")
AUDIT_PAGE = PageLink("/admin/ui/audit", "Back to the audit log", "Switchyard audit log")


def login_page(
    renderer: DashboardRenderer, message: str | None, status: int, csrf: str = ""
) -> Response:
    html = renderer.render("login.html", message=message, csrf=csrf)
    return secured(HTMLResponse(html, status_code=status))
