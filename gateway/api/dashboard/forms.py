"""What every dashboard form shares: reading the posted form, the session behind it, and the
CSRF checks.

Every POST form of the dashboard carries a hidden ``csrf`` field. Behind a session it must
equal the session's synchronizer token (kept server-side with it, ``access/sessions.py``);
the login form, which has no session yet, carries a double-submit token instead: the same
random value in the field and in an HttpOnly, SameSite=Strict cookie set when the form was
drawn. Anything else is a 403 page that changes nothing. The session cookie itself is
SameSite=Strict too, so a cross-site form never carries it.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import Response

from gateway.access.admins import Role
from gateway.access.sessions import DashboardSession
from gateway.api.dashboard.view import login_page
from gateway.api.pages import ANY_PAGE, PageLink, error_page
from gateway.services import Services

COOKIE_NAME = "sy_admin_session"
LOGIN_CSRF_COOKIE = "sy_login_csrf"
MAX_FORM_BYTES = 16384
CSRF_REFUSED = "The form's CSRF token is missing or wrong: reload the page and try again."


class FormRefused(Exception):
    """A form that cannot be read; ``response`` says why."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


async def read_form(
    request: Request, services: Services, back: PageLink = ANY_PAGE
) -> dict[str, str]:
    """The posted form's fields (the first value of each), at most ``MAX_FORM_BYTES``."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != "application/x-www-form-urlencoded":
        message = "The form must be posted as a form."
        raise FormRefused(error_page(services.pages, message, 400, back=back))
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormRefused(error_page(services.pages, "The form is too large.", 413, back=back))
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0].strip() for name, values in fields.items()}


async def session_of(request: Request, services: Services) -> DashboardSession | None:
    return await services.sessions.get(request.cookies.get(COOKIE_NAME))


async def page_session(
    request: Request, services: Services, role: Role
) -> DashboardSession | Response:
    """The session of a page that needs ``role``: else the login page (401) or a 403 page."""
    session = await session_of(request, services)
    if session is None:
        return login_form(services, None, 401)
    if not session.actor.may(role):
        return error_page(
            services.pages, f"This page needs the {role} role; you are {session.actor.role}.", 403
        )
    return session


async def posted(
    request: Request, services: Services, role: Role, back: PageLink = ANY_PAGE
) -> tuple[DashboardSession, dict[str, str]] | Response:
    """A POST behind a session: the session and the form, once the role and the form's CSRF
    token are right; else the page that refuses it (titled as ``back``, linking back)."""
    session = await page_session(request, services, role)
    if isinstance(session, Response):
        return session
    try:
        form = await read_form(request, services, back)
    except FormRefused as refused:
        return refused.response
    if not session.csrf_matches(form.get("csrf")):
        return error_page(services.pages, CSRF_REFUSED, 403, "csrf", back)
    return session, form


def login_form(services: Services, message: str | None, status: int) -> Response:
    """The login page, with a fresh double-submit CSRF token in its form and cookie."""
    token = secrets.token_urlsafe(32)
    response = login_page(services.pages, message, status, csrf=token)
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        token,
        max_age=3600,
        path="/admin/ui/login",
        httponly=True,
        samesite="strict",
        secure=services.settings.dashboard_cookie_secure,
    )
    return response


def login_csrf_matches(request: Request, form: dict[str, str]) -> bool:
    cookie, field = request.cookies.get(LOGIN_CSRF_COOKIE, ""), form.get("csrf", "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), field.encode())
