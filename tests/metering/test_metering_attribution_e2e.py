"""Attribution through a running gateway process: end users and tags on every usage event,
exact in every report form (``/admin/usage`` JSON and CSV, ``/v1/usage``, the CLI table and
CSV, the dashboard), a request with two tags counted in both, key default tags, bad tags
refused with a 400 that names the field and leaves no usage event, and keys named beside
their ids."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from chromium import CHROMIUM, chromium_page
from counting_provider import CountingProvider
from gateway_runner import ADMIN_KEY, GatewayProcess
from usage_workload import expected_nanos, run_usage_cli

# (key, end user sent how, tags sent how, streamed): the mix every report must add up. The
# provider books each request by its body's ``user``, so a body end user appears once; the
# header ones (which win over the body) and the empty header (no end user) repeat.
PLAN: list[tuple[str, str, str, bool]] = [
    ("alpha", "header:ana", "body:proj-x,exp-1", False),
    ("alpha", "header:ana", "body:proj-x", True),
    ("alpha", "body:bob", "header:proj-x,exp-2", False),
    ("alpha", "body:dan", "", False),  # the key's default tag
    ("alpha", "header:", "", True),  # no end user, the default tag
    ("beta", "header:ana", "body-text:exp-1, proj-y", False),  # one comma-separated string
    ("beta", "header:", "", False),  # untagged: beta has no default tags
    ("beta", "body:cy", "header:proj-y", True),
]


def body_user(index: int) -> str:
    """The body's ``user``: the end user itself when sent in the body, else ``r<index>``."""
    how, _, value = PLAN[index][1].partition(":")
    return value if how == "body" else f"r{index}"


def _send(base_url: str, key: str, index: int) -> None:
    _, user, tags, stream = PLAN[index]
    headers: dict[str, str] = {}
    how, _, value = user.partition(":")
    if how == "header":
        headers["x-switchyard-user"] = value
    metadata: dict[str, Any] = {"purpose": "report-test"}
    how, _, value = tags.partition(":")
    if how == "header":
        headers["x-switchyard-tags"] = value
    elif how == "body":
        metadata["tags"] = value.split(",")
    elif how == "body-text":
        metadata["tags"] = value
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
    request: dict[str, Any] = {
        "model": "m-alpha",
        "messages": [{"role": "user", "content": f"say {index} words please"}],
        "max_tokens": 3 + index,
        "user": body_user(index),
        "extra_headers": headers,
        "extra_body": {"metadata": metadata},
    }
    if stream:
        chunks = client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        for _ in chunks:
            pass
    else:
        client.chat.completions.create(**request)


def _expected(plan: list[tuple[str, str, str, bool]], costs: list[tuple[int, int]]) -> dict:
    """Requests, tokens and nano-dollars per tag and per end user, from the provider's own
    books: a request counts once in each of its tags."""
    defaults = {"alpha": ("team-default",), "beta": ()}
    by_tag: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    by_user: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for (key, user, tags, _), (tokens, nanos) in zip(plan, costs, strict=True):
        value = tags.partition(":")[2]
        named = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        for tag in named or defaults[key] or ("",):
            row = by_tag[tag]
            row[0], row[1], row[2] = row[0] + 1, row[1] + tokens, row[2] + nanos
        row = by_user[user.partition(":")[2]]
        row[0], row[1], row[2] = row[0] + 1, row[1] + tokens, row[2] + nanos
    return {"tag": dict(by_tag), "user": dict(by_user)}


def _figures(rows: list[dict[str, Any]], by: str) -> dict[str, list[int]]:
    return {r[by]: [r["requests"], r["total_tokens"], r["cost_nanos"]] for r in rows}


async def test_tags_and_end_users_in_every_report_form(
    gateway: GatewayProcess, provider: CountingProvider, tmp_path: Path
) -> None:
    keys = {
        "alpha": gateway.create_key(name="alpha-app", team="web", tags=["team-default"]),
        "beta": gateway.create_key(name="beta-batch"),
    }
    for index, (key, _, _, _) in enumerate(PLAN):
        _send(gateway.url, keys[key][1], index)

    # Bad attribution: a 400 naming the field, before routing (no usage event).
    auth = {"Authorization": f"Bearer {keys['beta'][1]}"}
    chat = {"model": "m-alpha", "messages": [{"role": "user", "content": "x"}]}
    refusals = {
        "metadata.tags": {**chat, "metadata": {"tags": ["has space"]}},
        "x-switchyard-tags": chat,
        "user": {**chat, "user": "a" * 201},
    }
    for field, body in refusals.items():
        headers = dict(auth)
        if field == "x-switchyard-tags":
            headers[field] = ",".join(f"t{i}" for i in range(9))  # one over the cap
        reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, headers=headers)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == field

    books = provider.snapshot()
    costs = []
    for index in range(len(PLAN)):
        served = books[body_user(index)]
        costs.append((served.prompt + served.completion, expected_nanos("m-alpha", served)))
    expected = _expected(PLAN, costs)
    total = [len(PLAN), sum(t for t, _ in costs), sum(n for _, n in costs)]
    # The gateway's own tag field never reaches the provider; the rest of metadata does.
    for index in range(len(PLAN)):
        assert provider.metadata[body_user(index)] == {"purpose": "report-test"}

    gateway.wait_exported()
    with gateway.admin() as admin:
        for by in ("tag", "user"):
            report = admin.get("/admin/usage", params={"group_by": by}).json()
            assert _figures(report["data"], by) == expected[by]
            totals = report["totals"]
            # Every request once in the totals, though two-tag requests are in two rows.
            assert [totals["requests"], totals["total_tokens"], totals["cost_nanos"]] == total
            reply = admin.get("/admin/usage", params={"group_by": by, "format": "csv"})
            rows = list(csv.DictReader(io.StringIO(reply.text)))
            assert {r[by]: [int(r["requests"]), int(r["total_tokens"]), int(r["cost_nanos"])]
                    for r in rows} == expected[by]  # fmt: skip
        by_key = admin.get("/admin/usage", params={"group_by": "key"}).json()["data"]
        named = {row["key"]: (row["key_name"], row["key_team"]) for row in by_key}
        assert named == {
            keys["alpha"][0]: ("alpha-app", "web"),
            keys["beta"][0]: ("beta-batch", None),
        }
        events = admin.get("/admin/usage/events", params={"limit": 100}).json()["data"]
        assert len(events) == len(PLAN)  # the refused requests left nothing
        assert sorted(e["end_user"] for e in events) == sorted(
            user.partition(":")[2] for _, user, _, _ in PLAN
        )
        reply = admin.get("/admin/usage", params={"group_by": "key", "format": "csv"})
        key_rows = {
            r["key"]: (r["key_name"], r["key_team"])
            for r in csv.DictReader(io.StringIO(reply.text))
        }
        assert key_rows[keys["alpha"][0]] == ("alpha-app", "web")

    # /v1/usage: the calling key's own, by tag and by end user.
    alpha_auth = {"Authorization": f"Bearer {keys['alpha'][1]}"}
    alpha_plan = [p for p in PLAN if p[0] == "alpha"]
    alpha_costs = [c for p, c in zip(PLAN, costs, strict=True) if p[0] == "alpha"]
    alpha_expected = _expected(alpha_plan, alpha_costs)
    for by in ("tag", "user"):
        own = httpx.get(gateway.url + "/v1/usage", params={"group_by": by}, headers=alpha_auth)
        assert own.status_code == 200, own.text
        assert _figures(own.json()[f"by_{by}"], by) == alpha_expected[by]
    bad = httpx.get(gateway.url + "/v1/usage", params={"group_by": "model"}, headers=alpha_auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "group_by"

    # The CLI: CSV exact, the table with (none) for untagged requests and key names.
    cli = run_usage_cli(gateway, "--group-by", "tag", "--format", "csv")
    assert cli.returncode == 0, cli.stderr
    rows = list(csv.DictReader(io.StringIO(cli.stdout)))
    assert {r["tag"]: [int(r["requests"]), int(r["total_tokens"]), int(r["cost_nanos"])]
            for r in rows} == expected["tag"]  # fmt: skip
    table = run_usage_cli(gateway, "--group-by", "user").stdout
    assert "(none)" in table and "ana" in table and "TOTAL" in table
    table = run_usage_cli(gateway, "--group-by", "key").stdout
    assert "alpha-app" in table and "beta-batch" in table and "web" in table

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium): dashboard unchecked")
    async with chromium_page(tmp_path / "chromium") as tools:
        await tools.log_in(gateway.url, ADMIN_KEY)
        page: dict[str, dict[str, list[int]]] = {}
        for by in ("tag", "user"):
            page[by] = await tools.evaluate(
                f"Object.fromEntries(Array.from(document.querySelectorAll("
                f"'table[data-table=by-{by}] tr[data-{by}]')).map(r => [r.dataset.{by}, "
                "[Number(r.dataset.requests), Number(r.dataset.tokens),"
                " Number(r.dataset.costNanos)]]))"
            )
        legend = await tools.evaluate("document.querySelector('#spend-by-key .legend').innerText")
    assert page == expected
    assert f"alpha-app ({keys['alpha'][0]})" in legend
