"""The dashboard's keys and teams page (``operator`` role): list them, create a key or a team,
rotate or revoke a key, delete a team. The audit page (``admin`` role) lists the audit log.

Each POST is a plain HTML form with the session's CSRF token (``forms.posted``);
the operations are the admin API's own (``access/key_admin.py``, ``access/team_admin.py``),
with its checks, its audit entries and its key moves. A refused form comes back to the keys
page with the error shown above the forms and the values as typed. Rotate and Revoke first
show a confirmation page (``GET``, no JavaScript needed): rotation asks for a grace period
and carries an idempotency token, so a form sent twice rotates once and is audited once. A
created or rotated key is shown once, on the page that answers the form, and never again.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.access import key_admin, team_admin
from gateway.access.keys import CreatedKey, KeyRecord
from gateway.access.sessions import DashboardSession
from gateway.access.team_models import TeamListQuery
from gateway.api.admin.audit import AuditListQuery, audit_query, record_action
from gateway.api.admin.keys import follow_moves
from gateway.api.dashboard.audit import audit_row
from gateway.api.dashboard.forms import page_session, posted
from gateway.api.dashboard.view import AUDIT_PAGE, KEYS_PAGE
from gateway.api.endpoint import Guard, endpoint
from gateway.api.pages import error_page, secured
from gateway.errors import GatewayError, InvalidRequest
from gateway.services import Services

MAX_SHOWN = 1000
KEY_INT_FIELDS = ("rpm", "tpm", "max_parallel_requests")
TEAM_BUDGETS = ("day", "week", "month", "total")

# What a change to a key answers: the record, or the record and its new secret.
KeyChange = TypeVar("KeyChange", KeyRecord, CreatedKey, key_admin.Rotation)


def _number(form: dict[str, str], name: str, kind: type) -> Any:
    try:
        return kind(form[name])
    except ValueError:
        raise InvalidRequest(f"{name}: must be a number", param=name) from None


def key_fields(form: dict[str, str]) -> dict[str, Any]:
    """The create-key form as the admin API's payload (an empty field is not given)."""
    data: dict[str, Any] = {}
    for name in ("name", "team", "budget_period"):
        if form.get(name):
            data[name] = form[name]
    for name in KEY_INT_FIELDS:
        if form.get(name):
            data[name] = _number(form, name, int)
    if form.get("budget_usd"):
        data["budget_usd"] = _number(form, "budget_usd", float)
    if form.get("models"):
        data["models"] = [m.strip() for m in form["models"].split(",") if m.strip()]
    return data


def team_fields(form: dict[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {"id": form.get("id", "")}
    if form.get("name"):
        data["name"] = form["name"]
    for name in KEY_INT_FIELDS:
        if form.get(name):
            data[name] = _number(form, name, int)
    budgets = {
        period: _number(form, f"budget_{period}", float)
        for period in TEAM_BUDGETS
        if form.get(f"budget_{period}")
    }
    if budgets:
        data["budgets_usd"] = budgets
    return data


def _refused(services: Services, exc: GatewayError) -> Response:
    return error_page(services.pages, exc.message, exc.status, exc.param, AUDIT_PAGE)


def _render(services: Services, template: str, status: int = 200, **context: Any) -> Response:
    return secured(HTMLResponse(services.pages.render(template, **context), status_code=status))


async def keys_page(request: Request, services: Services) -> Response:
    """``GET /admin/ui/keys``: keys (rotate, revoke) and teams (delete), and the forms that
    create them."""
    session = await page_session(request, services, "operator")
    if isinstance(session, Response):
        return session
    return await _keys_page(services, session)


async def _keys_page(
    services: Services,
    session: DashboardSession,
    refusal: GatewayError | None = None,
    form: dict[str, str] | None = None,
) -> Response:
    """The keys page; after a refused form, with its error and the values as typed."""
    keys = await services.keys.list(limit=MAX_SHOWN)
    teams, _ = await team_admin.list_teams(services.teams, TeamListQuery(limit=MAX_SHOWN))
    typed = {k: v for k, v in (form or {}).items() if k != "csrf"}
    return _render(
        services,
        "manage.html",
        status=refusal.status if refusal is not None else 200,
        session=session,
        active="keys",
        keys=[record.public_view() for record in keys.records],
        teams=[team.public_view() for team in teams],
        error=refusal.message if refusal is not None else None,
        error_param=(refusal.param or "") if refusal is not None else "",
        form=typed,
        form_name=typed.get("form", ""),
    )


Confirmed = Literal["rotate", "revoke"]


async def _confirm_page(
    request: Request,
    services: Services,
    session: DashboardSession,
    action: Confirmed,
    refusal: GatewayError | None = None,
    form: dict[str, str] | None = None,
) -> Response:
    """The page that asks before a rotation or revocation acts (with a grace field for a
    rotation, and the idempotency token its form is sent with)."""
    key_id = request.path_params["key_id"]
    try:
        record = await key_admin.show_key(services.keys, key_id)
    except GatewayError as exc:
        return error_page(services.pages, exc.message, exc.status, exc.param, KEYS_PAGE)
    form = form or {}
    return _render(
        services,
        "confirm.html",
        status=refusal.status if refusal is not None else 200,
        session=session,
        active="keys",
        action=action,
        key=record.public_view(),
        grace_seconds=form.get("grace_seconds", "0"),
        idempotency_key=form.get("idempotency_key") or secrets.token_urlsafe(18),
        error=refusal.message if refusal is not None else None,
        error_param=(refusal.param or "") if refusal is not None else "",
    )


def _confirm_handler(action: Confirmed) -> Callable[[Request, Services], Awaitable[Response]]:
    async def confirm(request: Request, services: Services) -> Response:
        session = await page_session(request, services, "operator")
        if isinstance(session, Response):
            return session
        return await _confirm_page(request, services, session, action)

    return confirm


def _shown_once(
    services: Services, session: DashboardSession, created: CreatedKey, what: str
) -> Response:
    view = created.record.public_view()
    until = view.get("previous_secret_valid_until")
    return _render(
        services,
        "secret.html",
        status=201 if what == "created" else 200,
        session=session,
        active="keys",
        what=what,
        key=view,
        secret=created.key,
        old_valid_until=(
            datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if until else None
        ),
    )


@dataclass(frozen=True)
class _Post:
    """An operator's form POST, its session and CSRF token checked."""

    request: Request
    services: Services
    session: DashboardSession
    form: dict[str, str]

    async def audit(self, action: str, target: str, before: Any, after: Any) -> None:
        actor = self.session.actor
        await record_action(
            self.services, self.request, actor, action, target, before=before, after=after
        )


def _operator_form(
    act: Callable[[_Post], Awaitable[Response]],
) -> Callable[[Request, Services], Awaitable[Response]]:
    """The handler of an operator's form: ``act`` runs once the session and the form are right
    (else the page that refuses them), and an operation it refuses is answered by its page."""

    @functools.wraps(act)
    async def handler(request: Request, services: Services) -> Response:
        checked = await posted(request, services, "operator", KEYS_PAGE)
        if isinstance(checked, Response):
            return checked
        session, form = checked
        try:
            return await act(_Post(request, services, session, form))
        except GatewayError as exc:  # back to the page the form is on, the error shown there
            return await _keys_page(services, session, exc, form)

    return handler


@_operator_form
async def create_key(post: _Post) -> Response:
    services = post.services
    created = await key_admin.create_key(
        services.keys, services.teams, key_fields(post.form), services.policies.policy_or_none()
    )
    view = created.record.public_view()
    await post.audit("key.create", f"key:{view['id']}", None, view)
    await follow_moves(services, created.record, created.record)
    return _shown_once(services, post.session, created, "created")


@_operator_form
async def rotate_key(post: _Post) -> Response:
    """The confirmation page's form (``confirm=yes``, a grace period, an idempotency token);
    without ``confirm`` it only shows that page."""
    services, form = post.services, post.form
    if form.get("confirm") != "yes":
        return await _confirm_page(post.request, services, post.session, "rotate", form=form)
    try:
        grace = (
            {"grace_seconds": _number(form, "grace_seconds", float)}
            if form.get("grace_seconds")
            else {}
        )
        rotation = await _change_key(
            post,
            "key.rotate",
            lambda key_id: key_admin.rotate_key_once(
                services.keys, key_id, grace, form.get("idempotency_key") or None
            ),
        )
    except InvalidRequest as exc:  # a bad grace period: asked again, with the error
        return await _confirm_page(post.request, services, post.session, "rotate", exc, form)
    return _shown_once(services, post.session, rotation.created, "rotated")


@_operator_form
async def revoke_key(post: _Post) -> Response:
    if post.form.get("confirm") != "yes":
        return await _confirm_page(post.request, post.services, post.session, "revoke")
    await _change_key(
        post, "key.revoke", lambda key_id: key_admin.revoke_key(post.services.keys, key_id)
    )
    return RedirectResponse(KEYS_PAGE.href, status_code=303)


async def _change_key(
    post: _Post, action: str, change: Callable[[str], Awaitable[KeyChange]]
) -> KeyChange:
    """A change to the key in the path: the key as it was, the change, its cached copy
    dropped, the audit entry with both views (none for a replayed rotation: it changed
    nothing)."""
    key_id = post.request.path_params["key_id"]
    before = await key_admin.show_key(post.services.keys, key_id)
    after = await change(key_id)
    post.services.auth.invalidate(key_id)
    if isinstance(after, key_admin.Rotation):
        if after.replayed:
            return after
        record = after.created.record
    else:
        record = after.record if isinstance(after, CreatedKey) else after
    await post.audit(action, f"key:{key_id}", before.public_view(), record.public_view())
    return after


@_operator_form
async def create_team(post: _Post) -> Response:
    services = post.services
    team, adopted = await team_admin.create_team(
        services.teams, services.keys, team_fields(post.form)
    )
    view = {**team.public_view(), "adopted_keys": adopted}
    await post.audit("team.create", f"team:{team.id}", None, view)
    for key_id in adopted:
        services.auth.invalidate(key_id)
    return RedirectResponse(KEYS_PAGE.href, status_code=303)


@_operator_form
async def delete_team(post: _Post) -> Response:
    team_id = post.request.path_params["team_id"]
    team = await team_admin.delete_team(post.services.teams, post.services.keys, team_id)
    await post.services.limiter.forget_team(team_id)
    await post.audit("team.delete", f"team:{team_id}", team.public_view(), None)
    return RedirectResponse(KEYS_PAGE.href, status_code=303)


async def audit_page(request: Request, services: Services) -> Response:
    """``GET /admin/ui/audit?actor=&action=&target=&from=&to=&cursor=``: the audit log."""
    session = await page_session(request, services, "admin")
    if isinstance(session, Response):
        return session
    filters = {k: v for k, v in request.query_params.items() if v and k in _AUDIT_FILTERS}
    try:
        query = audit_query(AuditListQuery.model_validate({**filters, "limit": 200}))
        page = await services.audit.query(query)
    except GatewayError as exc:
        return _refused(services, exc)
    except ValueError:
        return error_page(services.pages, "A filter of the audit page is not valid.", 400)
    entries = [audit_row(entry) for entry in page.entries]
    return _render(
        services,
        "audit.html",
        session=session,
        active="audit",
        entries=entries,
        filters=filters,
        next_cursor=page.next_cursor,
    )


_AUDIT_FILTERS = ("actor", "action", "target", "from", "to", "cursor")


routes = [
    Route("/admin/ui/keys", endpoint(keys_page, Guard.DASHBOARD), methods=["GET"]),
    Route("/admin/ui/keys", endpoint(create_key, Guard.DASHBOARD), methods=["POST"]),
    Route(
        "/admin/ui/keys/{key_id}/rotate",
        endpoint(_confirm_handler("rotate"), Guard.DASHBOARD),
        methods=["GET"],
    ),
    Route(
        "/admin/ui/keys/{key_id}/rotate", endpoint(rotate_key, Guard.DASHBOARD), methods=["POST"]
    ),
    Route(
        "/admin/ui/keys/{key_id}/revoke",
        endpoint(_confirm_handler("revoke"), Guard.DASHBOARD),
        methods=["GET"],
    ),
    Route(
        "/admin/ui/keys/{key_id}/revoke", endpoint(revoke_key, Guard.DASHBOARD), methods=["POST"]
    ),
    Route("/admin/ui/teams", endpoint(create_team, Guard.DASHBOARD), methods=["POST"]),
    Route(
        "/admin/ui/teams/{team_id}/delete",
        endpoint(delete_team, Guard.DASHBOARD),
        methods=["POST"],
    ),
    Route("/admin/ui/audit", endpoint(audit_page, Guard.DASHBOARD), methods=["GET"]),
]
