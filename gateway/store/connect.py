"""Build the gateway's Redis client from ``SWITCHYARD_REDIS_URL``: one node or a Redis Cluster.

Accepted forms:

* ``redis://[user:pass@]host:port/db``, ``rediss://...`` (TLS), ``unix:///path/redis.sock?db=0``:
  a single Redis server (or a proxy in front of one);
* ``redis+cluster://[user:pass@]host:port[,host:port...]`` (``rediss+cluster://`` for TLS): a
  Redis Cluster reached through the listed seed nodes; the client learns the rest of the
  topology from them and follows it through failovers and resharding.

Every multi-key script of the gateway keeps its keys in one hash slot (``{key:<id>}``), so the
same code runs against both kinds of client. ``REDIS_FAILURES`` and ``REDIS_UNAVAILABLE`` name the
exceptions that mean "Redis could not answer" for either kind: a cluster adds its own (a slot
without a master during a failover, a request that ran out of redirects), and some of those are
not ``RedisError`` subclasses.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SINGLE_SCHEMES = ("redis", "rediss", "unix")

RedisClient = Redis | RedisCluster

# Anything that means the command may not have run because Redis (or a cluster slot) was away.
REDIS_FAILURES: tuple[type[BaseException], ...] = (
    redis_errors.RedisError,
    redis_errors.RedisClusterException,
    OSError,
    asyncio.TimeoutError,
)

# The narrower set the limiter turns into 503 / fail-open: unreachable, timed out, read-only
# (a demoted master), loading, or a cluster slot briefly without a reachable master.
REDIS_UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.ClusterError,
    redis_errors.TryAgainError,
    redis_errors.RedisClusterException,
    OSError,
    asyncio.TimeoutError,
)


class RedisUrlError(ValueError):
    """A SWITCHYARD_REDIS_URL that cannot work; the message says what is wrong."""


@dataclass(frozen=True)
class ClusterTarget:
    seeds: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: bool


def _port(text: str, netloc: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise RedisUrlError(f"bad port {text!r} in cluster seed list {netloc!r}") from None
    if not 1 <= port <= 65535:
        raise RedisUrlError(f"port {port} out of range in cluster seed list {netloc!r}")
    return port


def _parse_cluster(url: str) -> ClusterTarget:
    # urlsplit rejects "h1:1,h2:2" as a port, so the seed list is split by hand.
    scheme, rest = url.split("://", 1)
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise RedisUrlError(f"a Redis Cluster has only database 0, the URL names /{path}")
    if query:
        raise RedisUrlError(f"cluster URL options are not supported: {sorted(parse_qs(query))}")
    username = password = None
    if "@" in netloc:
        credentials, netloc = netloc.rsplit("@", 1)
        user_part, has_password, password_part = credentials.partition(":")
        username = unquote(user_part) or None
        password = unquote(password_part) if has_password else None
    seeds: list[tuple[str, int]] = []
    for item in netloc.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # IPv6 literal: [::1]:7000
            host, _, port_text = item[1:].partition("]:")
        else:
            host, _, port_text = item.rpartition(":")
        if not host or not port_text:
            raise RedisUrlError(f"cluster seed {item!r} must be host:port")
        seeds.append((host, _port(port_text, netloc)))
    if not seeds:
        raise RedisUrlError("a cluster URL needs at least one seed node: redis+cluster://host:port")
    return ClusterTarget(tuple(seeds), username, password, scheme == "rediss+cluster")


def check_redis_url(url: str) -> None:
    """Raise ``RedisUrlError`` unless ``url`` is one of the accepted forms (empty = embedded)."""
    if not url:
        return
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in CLUSTER_SCHEMES:
        _parse_cluster(url)
        return
    if scheme not in SINGLE_SCHEMES:
        raise RedisUrlError(
            "must start with redis://, rediss://, unix:// or redis+cluster://"
            f" (got {url.split('://', 1)[0] if '://' in url else url!r})"
        )
    parts = urlsplit(url)
    if scheme == "unix":
        if not parts.path:
            raise RedisUrlError("a unix:// URL needs the socket path: unix:///path/redis.sock")
        return
    if not parts.hostname:
        raise RedisUrlError("the URL names no host: redis://host:port/0")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise RedisUrlError(f"bad port: {exc}") from None


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES if "://" in url else False


def connect_redis(url: str, timeout_s: float, max_connections: int = 1024) -> RedisClient:
    """The gateway's shared async client for ``url`` (a single node or a cluster).

    One immediate retry and no backoff: an outage or a failover must surface within the timeout,
    so that closed/open mode acts on it, and the usage spool takes what could not be written.
    """
    check_redis_url(url)
    common: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 1),
        "max_connections": max_connections,
    }
    if not is_cluster_url(url):
        return Redis.from_url(url, **common)
    target = _parse_cluster(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.seeds],
        username=target.username,
        password=target.password,
        ssl=target.tls,
        # Topology is re-read after a connection error; redirects (MOVED after a failover)
        # are followed without one.
        require_full_coverage=False,
        **common,
    )


def change_feed(client: RedisClient) -> PubSub:
    """A pub/sub connection for the key-change channel.

    On a cluster, classic PUBLISH reaches every node, so any one primary will do. A random
    known primary is taken each time, so that after a failover the next attempt does not keep
    dialling the dead node (the topology refresh happens on the client's next command error).
    """
    if isinstance(client, RedisCluster):
        primaries = client.get_primaries()
        node = random.choice(primaries) if primaries else None
        return client.pubsub(node=node, ignore_subscribe_messages=True)  # type: ignore[return-value]
    return client.pubsub(ignore_subscribe_messages=True)


async def warm_up(client: RedisClient) -> str | None:
    """Learn a cluster's topology before traffic arrives; returns the error text on failure.

    redis-py initializes a cluster client lazily, and a burst of first commands racing that
    initialization sees connections closed under them. A single node needs nothing here.
    If the cluster is unreachable now, the client initializes on its first command instead.
    """
    if not isinstance(client, RedisCluster):
        return None
    try:
        await client.initialize()
    except REDIS_FAILURES as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
