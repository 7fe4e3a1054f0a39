"""Where the replicas are: a static list of base URLs, or every address of one DNS name.

``StaticDiscovery`` answers its list. ``DnsDiscovery`` resolves a name such as a Kubernetes
headless Service (``engine-headless.ns.svc.cluster.local``, one A/AAAA record per ready pod)
and answers one base URL per address, ``scheme://address:port``. It resolves through the event
loop's ``getaddrinfo`` (run in the loop's executor, so the loop never blocks) or any resolver
callable given to it, and is asked again every ``refresh_s``. A failed or empty resolution is a
``DiscoveryError``; the fleet then keeps the replicas it knows rather than dropping them all
over a DNS hiccup (health ejects the ones that are really gone).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import urlsplit

# (host, port) -> the host's addresses, as text ("10.0.0.5", "fd00::5").
Resolver = Callable[[str, int], Awaitable[list[str]]]


class DiscoveryError(Exception):
    """The replica list could not be read this time."""


class Discovery(Protocol):
    refresh_s: float | None  # how often to ask again; None = the answer never changes

    async def resolve(self) -> list[str]:
        """The replicas' base URLs now (``DiscoveryError`` when that cannot be told)."""
        ...


def _base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"a replica URL needs http:// or https:// and a host, not {url!r}")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(f"a replica URL is scheme://host:port only, not {url!r}")
    return f"{parts.scheme}://{parts.netloc}"


class StaticDiscovery:
    refresh_s: float | None = None

    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ValueError("a static fleet needs at least one replica URL")
        self.urls = sorted({_base_url(url) for url in urls})

    async def resolve(self) -> list[str]:
        return list(self.urls)


async def getaddrinfo_resolver(host: str, port: int) -> list[str]:
    """The host's addresses through the running loop's ``getaddrinfo`` (off the loop)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # socket.gaierror; a name IDNA cannot encode
        raise DiscoveryError(f"cannot resolve {host}: {exc}") from None
    return [str(info[4][0]) for info in infos]


def address_url(scheme: str, address: str, port: int) -> str:
    """``scheme://address:port``, IPv6 addresses bracketed (and scope ids kept)."""
    host = address.split("%", 1)[0]
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        return f"{scheme}://{address}:{port}"
    return (
        f"{scheme}://[{address}]:{port}" if literal.version == 6 else f"{scheme}://{address}:{port}"
    )


class DnsDiscovery:
    def __init__(
        self,
        url: str,
        *,
        refresh_s: float = 5.0,
        timeout_s: float = 2.0,
        resolver: Resolver = getaddrinfo_resolver,
    ) -> None:
        """``url``: ``scheme://name:port`` of the Service (the port the replicas listen on)."""
        parts = urlsplit(_base_url(url))
        if parts.port is None:
            raise ValueError(f"a DNS fleet URL needs the replicas' port, e.g. {url}:8080")
        if not refresh_s > 0 or not timeout_s > 0:
            raise ValueError("refresh_s and timeout_s must be > 0")
        assert parts.hostname is not None  # checked by _base_url
        try:
            parts.hostname.encode("idna")
        except UnicodeError:
            raise ValueError(f"{parts.hostname!r} is not a valid DNS name") from None
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.refresh_s: float | None = refresh_s
        self.timeout_s = timeout_s
        self.resolver = resolver

    async def resolve(self) -> list[str]:
        try:
            addresses = await asyncio.wait_for(
                self.resolver(self.host, self.port), timeout=self.timeout_s
            )
        except TimeoutError:
            raise DiscoveryError(f"resolving {self.host} took over {self.timeout_s}s") from None
        except (OSError, UnicodeError) as exc:
            raise DiscoveryError(f"cannot resolve {self.host}: {exc}") from None
        if not addresses:
            raise DiscoveryError(f"{self.host} resolved to no address")
        return sorted({address_url(self.scheme, address, self.port) for address in addresses})
