"""What every HTML page of the app shares: the headers it carries (``secured``), the page a
refusal came from (``PageLink``), and the error page, drawn by the app's page renderer (the
dashboard's templates) for the dashboard's routes and for ``endpoint``'s ``Guard.DASHBOARD``."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import HTMLResponse, Response

from gateway.services import PageRenderer


def secured(response: Response) -> Response:
    """The headers every dashboard answer carries: never cached, framed or leaked."""
    response.headers["cache-control"] = "no-store"
    response.headers["x-frame-options"] = "DENY"
    response.headers["content-security-policy"] = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'"
    )
    response.headers["referrer-policy"] = "no-referrer"
    return response


@dataclass(frozen=True)
class PageLink:
    """The page a refusal came from: its title, and the way back to it."""

    href: str
    label: str
    title: str


ANY_PAGE = PageLink("/admin/ui", "Back to the usage page", "Switchyard")


def error_page(
    renderer: PageRenderer,
    message: str,
    status: int,
    param: str | None = None,
    back: PageLink = ANY_PAGE,
) -> Response:
    """The dashboard's error page (a bad range, a store that is down) with ``status``, titled
    as the page it came from and linking back to it."""
    html = renderer.render(
        "error.html",
        message=message,
        param=param or "",
        title=back.title,
        back_href=back.href,
        back_label=back.label,
    )
    return secured(HTMLResponse(html, status_code=status))
