"""The dashboard's forms as a test client fills them: every POST carries its CSRF token.

The login form's token is a double-submit one (the same value in the form and in the
``sy_login_csrf`` cookie the login page sets); every form behind a session carries the
session's token, which the pages draw into their forms. Cookies are passed by hand: they are
Secure by default, and httpx keeps those off plain http.
"""

from __future__ import annotations

import re

import httpx

SESSION_COOKIE = "sy_admin_session"
LOGIN_CSRF_COOKIE = "sy_login_csrf"
_CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_in(html: str) -> str:
    found = _CSRF_FIELD.search(html)
    assert found, "no CSRF field on the page:\n" + html[:2000]
    return found.group(1)


def login(client: httpx.Client, credential: str) -> httpx.Response:
    """Open the login page, then post its form with ``credential``."""
    page = client.get("/admin/ui", headers={"cookie": ""})
    token = csrf_in(page.text)
    return client.post(
        "/admin/ui/login",
        data={"key": credential, "csrf": token},
        headers={"cookie": f"{LOGIN_CSRF_COOKIE}={token}"},
    )


def session_headers(token: str) -> dict[str, str]:
    return {"cookie": f"{SESSION_COOKIE}={token}"}


def session_csrf(client: httpx.Client, token: str, path: str = "/admin/ui") -> str:
    """The CSRF token the session's pages put in their forms."""
    return csrf_in(client.get(path, headers=session_headers(token)).text)


def post_form(
    client: httpx.Client, token: str, path: str, fields: dict[str, str] | None = None
) -> httpx.Response:
    """Post a dashboard form behind the session ``token``, with its CSRF token."""
    data = {**(fields or {}), "csrf": session_csrf(client, token)}
    return client.post(path, data=data, headers=session_headers(token))
