"""Who the client is behind a proxy: uvicorn's forwarded-header handling, on only for the
peers in ``SWITCHYARD_TRUSTED_PROXIES``.

uvicorn by default believes ``X-Forwarded-For`` from 127.0.0.1 (or ``FORWARDED_ALLOW_IPS``),
so anything on the gateway's host could claim any address: lock out an admin at that address
in the failed-credential throttle, or dodge it with a new address per guess. Here the header
is read only when the TCP peer is a listed proxy, and then uvicorn takes the right-most
address of the chain that is not itself a listed proxy (what the last trusted hop saw), so a
client's own ``X-Forwarded-For`` entries are ignored. With no proxy listed, the client is the
TCP peer and forwarded headers are ignored entirely.
"""

from __future__ import annotations

from typing import Any

from gateway.settings import Settings, trusted_proxy_list


def proxy_options(settings: Settings) -> dict[str, Any]:
    """The ``uvicorn.Config`` options for forwarded headers."""
    trusted = trusted_proxy_list(settings.trusted_proxies)
    # An explicit list even when empty: uvicorn would otherwise read FORWARDED_ALLOW_IPS.
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted}
