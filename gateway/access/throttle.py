"""Failed admin credentials, counted per client address in Redis; past the limit, 429.

Each failure (a wrong admin bearer on ``/admin/*``, a wrong key in the dashboard's login form)
adds one to ``sy:authfail:<address>`` (an IPv6 client's /64), a counter that lives ``window_s`` from the address's first
failure (a fixed window, so every replica counts the same failures). Once it reaches ``limit``,
every admin credential from that address, right or wrong, is refused with 429 and a Retry-After
of what is left of the window: guessing stops instead of merely slowing down.

The address is the client's as ``gateway/server/proxies.py`` settles it: forwarded headers
count only from ``SWITCHYARD_TRUSTED_PROXIES``, so a peer cannot charge its failures to an
address it names, nor escape the count with a new one per guess; behind a listed proxy each
client has its own count, and its failures never refuse a right credential from another.

Every failure is logged with the address and how many it has made, never with what was tried.
If Redis cannot answer, the attempt goes through unthrottled (logged): the admin API must stay
usable during an outage, and the admin key is a long random token, not a password.
"""

from __future__ import annotations

import ipaddress
import math
import time
from typing import Any

from gateway.errors import RateLimited
from gateway.settings import ThrottleSettings
from gateway.store.connect import REDIS_FAILURES, RedisClient

# One atomic step: count the failure; the first of a window starts its clock. A counter left
# without a TTL (it cannot happen here, but a stray SET could) gets one, so nobody is locked
# out for good.
_COUNT_FAILURE = """
local failures = redis.call('INCR', KEYS[1])
if failures == 1 or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return {failures, redis.call('PTTL', KEYS[1])}
"""
_MAX_ADDRESS_CHARS = 100


class AuthThrottle:
    def __init__(
        self,
        redis: RedisClient,
        settings: ThrottleSettings,
        *,
        log: Any,
        metrics: Any = None,
        prefix: str = "sy:authfail:",
    ) -> None:
        self._redis = redis
        self.limit = settings.limit
        self._window_ms = max(1, round(settings.window_s * 1000))
        self._log = log
        self._metrics = metrics
        self._prefix = prefix
        self._last_outage_log = 0.0

    def _key(self, address: str) -> str:
        return self._prefix + counted_address(address)

    async def check(self, address: str) -> None:
        """Raise ``RateLimited`` (429, Retry-After) while ``address`` is over the limit."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(self._key(address))
                pipe.pttl(self._key(address))
                count, ttl_ms = await pipe.execute()
        except REDIS_FAILURES as exc:
            self._outage(exc)
            return
        if count is not None and int(count) >= self.limit:
            raise self.refusal(int(ttl_ms))

    async def failed(self, address: str, what: str) -> None:
        """Count and log one failed credential from ``address`` (``what`` names the door)."""
        if self._metrics is not None:
            self._metrics.admin_auth_failures.labels(what).inc()
        try:
            failures, ttl_ms = await self._redis.eval(
                _COUNT_FAILURE, 1, self._key(address), self._window_ms
            )
        except REDIS_FAILURES as exc:
            self._outage(exc)
            self._log.warning("admin_auth_failed", client=address, what=what, failures=None)
            return
        failures = int(failures)
        self._log.warning(
            "admin_auth_failed", client=address, what=what, failures=failures, limit=self.limit
        )
        if failures == self.limit:
            self._log.warning(
                "admin_auth_throttled",
                client=address,
                what=what,
                retry_after_s=_seconds(int(ttl_ms)),
            )

    def refusal(self, ttl_ms: int) -> RateLimited:
        retry_after = _seconds(ttl_ms)
        return RateLimited(
            f"Too many failed admin credentials from this address; try again in {retry_after} s.",
            code="too_many_auth_failures",
            headers={"retry-after": str(retry_after)},
        )

    def _outage(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_outage_log >= 1.0:  # an outage logs once a second, not per request
            self._last_outage_log = now
            self._log.warning("admin_auth_throttle_unavailable", error=type(exc).__name__)


def counted_address(address: str) -> str:
    """What failures are counted by: an IPv4 address, or the /64 of an IPv6 one (a single host
    is routinely given a whole /64, and would otherwise have a fresh address for each guess).
    Anything else (a unix socket's name) counts as itself."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:_MAX_ADDRESS_CHARS]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _seconds(ttl_ms: int) -> int:
    return max(1, math.ceil(ttl_ms / 1000)) if ttl_ms > 0 else 1
