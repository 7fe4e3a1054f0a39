"""The running gateway's admin API, for CLI commands that act through the gateway (``policy
get|diff|apply``) rather than on its Redis: the gateway validates, writes and audits them.

The gateway is ``--url`` (default: ``http://SWITCHYARD_HOST:SWITCHYARD_PORT``, loopback when it
listens on every address); the credential is ``--admin-key``, else ``SWITCHYARD_ADMIN_KEY``, else
DATA_DIR/admin_key (read, never created: the gateway writes it on its first start). A refusal
is raised as a GatewayError carrying the gateway's message and field.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.errors import GatewayError
from gateway.settings import Settings, SettingsError

_EVERY_ADDRESS = {"0.0.0.0", "::", ""}
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class AdminApi:
    base_url: str
    admin_key: str

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--url", help="the gateway (default: http://HOST:PORT from settings)")
        parser.add_argument(
            "--admin-key",
            dest="admin_key",
            help="default: SWITCHYARD_ADMIN_KEY or DATA_DIR/admin_key",
        )

    @classmethod
    def from_args(cls, settings: Settings, args: argparse.Namespace) -> AdminApi:
        url = args.url or _default_url(settings)
        return cls(url.rstrip("/"), args.admin_key or _admin_key(settings))

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin_key}", **kwargs.pop("headers", {})}
        try:
            response = httpx.request(
                method, self.base_url + path, headers=headers, timeout=TIMEOUT_S, **kwargs
            )
        except httpx.HTTPError as exc:
            raise GatewayError(f"cannot reach the gateway at {self.base_url}: {exc}") from None
        if response.is_success:
            return response
        raise _refusal(response)


def _default_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.host in _EVERY_ADDRESS else settings.host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def _admin_key(settings: Settings) -> str:
    if settings.admin_key is not None and settings.admin_key.get_secret_value():
        return settings.admin_key.get_secret_value()
    path = settings.data_dir / "admin_key"
    try:
        return path.read_text().strip()
    except OSError:
        raise SettingsError(
            f"no admin key: set SWITCHYARD_ADMIN_KEY or pass --admin-key ({path} is not readable)"
        ) from None


def _refusal(response: httpx.Response) -> GatewayError:
    try:
        error = response.json()["error"]
        message, param = str(error["message"]), error.get("param")
    except (ValueError, KeyError, TypeError):
        message, param = response.text.strip()[:300] or response.reason_phrase, None
    where = f" ({param})" if param else ""
    return GatewayError(f"the gateway refused it: {response.status_code}{where}: {message}")
