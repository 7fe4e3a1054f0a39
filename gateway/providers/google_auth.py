"""OAuth access tokens for Vertex AI, from ``google-auth``.

A service-account key file (the policy's ``vertex.credentials_file``) or, without one,
Application Default Credentials: ``GOOGLE_APPLICATION_CREDENTIALS``, a gcloud login, or
workload identity through the metadata server on GKE and Cloud Run. A service account mints
its token by signing a JWT assertion (RS256) and exchanging it at its ``token_uri``.

google-auth refreshes synchronously over HTTP, so every refresh runs on a worker thread, never
on the event loop, one at a time. A token is refreshed ``REFRESH_BEFORE_S`` before it expires:
inside that window the current token still goes out while a background refresh replaces it,
so no request waits for a refresh unless the token has actually run out (or there is none yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from gateway.errors import UpstreamError

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# Begin refreshing this long before expiry; google-auth itself treats a token as expired
# 3 min 45 s before its end, so the refresh is done by then.
REFRESH_BEFORE_S = 300.0


class GoogleTokenSource:
    """Bearer tokens for one provider. ``await token()`` returns a valid access token."""

    def __init__(
        self,
        provider: str,
        credentials_file: str | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.provider = provider
        self.credentials_file = credentials_file
        self._clock = clock
        self._credentials: Any = None
        self._token: str | None = None
        self._expires_at: float | None = None  # epoch seconds; None: no known expiry
        self._lock = asyncio.Lock()
        self._background: asyncio.Task[None] | None = None

    async def token(self) -> str:
        token, expires_at = self._token, self._expires_at
        if token is not None and self._fresh():
            return token
        if token is not None and expires_at is not None and self._clock() < expires_at:
            self._refresh_in_background()  # still valid: this request need not wait
            return token
        await self._refresh()
        assert self._token is not None
        return self._token

    def _refresh_in_background(self) -> None:
        if self._background is None or self._background.done():
            self._background = asyncio.get_running_loop().create_task(self._quiet_refresh())

    async def _quiet_refresh(self) -> None:
        # A failure here is retried by the next request; the token it replaces still works.
        with contextlib.suppress(UpstreamError):
            await self._refresh()

    async def _refresh(self) -> None:
        async with self._lock:
            if self._fresh():
                return  # another caller refreshed while this one waited
            self._token, self._expires_at = await asyncio.to_thread(self._refresh_blocking)

    def _fresh(self) -> bool:
        expires_at = self._expires_at
        if self._token is None:
            return False
        return expires_at is None or self._clock() < expires_at - REFRESH_BEFORE_S

    def _refresh_blocking(self) -> tuple[str, float | None]:
        """On a worker thread: load the credentials (first time), then refresh them."""
        try:
            import google.auth
            import google.auth.exceptions
            from google.auth.transport.requests import Request
            from google.oauth2 import service_account
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise self._failed(f"google-auth is not installed ({exc})") from None
        try:
            if self._credentials is None:
                if self.credentials_file:
                    self._credentials = service_account.Credentials.from_service_account_file(
                        self.credentials_file, scopes=SCOPES
                    )
                else:
                    self._credentials, _ = google.auth.default(scopes=SCOPES)
            self._credentials.refresh(Request())
        except (google.auth.exceptions.GoogleAuthError, OSError, ValueError) as exc:
            raise self._failed(type(exc).__name__) from None
        expiry = self._credentials.expiry  # naive UTC datetime, or None
        expires_at = None if expiry is None else _utc_seconds(expiry)
        return self._credentials.token, expires_at

    def _failed(self, why: str) -> UpstreamError:
        # The cause's text may quote the key file: only its kind is relayed.
        return UpstreamError(
            f"provider {self.provider} could not get a Google access token ({why})",
            status=502,
            retryable=True,
            kind="auth",
            provider=self.provider,
            code="upstream_auth_failed",
            upstream_status=401,
        )

    def close(self) -> None:
        if self._background is not None:
            self._background.cancel()


def _utc_seconds(expiry: Any) -> float:
    """google-auth's expiry is a naive datetime in UTC."""
    import calendar

    return float(calendar.timegm(expiry.utctimetuple()))
