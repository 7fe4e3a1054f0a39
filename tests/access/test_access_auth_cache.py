"""The in-process cache of verified key records: requests that find a key's entry lapsed share
one read of its record, and a read older than a change is never kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from gateway_runner import PEPPER

from gateway.access.auth import Authenticator
from gateway.access.keys import CreatedKey, KeyRecord, KeyStore
from gateway.errors import AuthenticationFailed, ServiceUnavailable
from gateway.settings import AuthSettings
from gateway.store.connect import RedisClient, connect_redis


class CountedKeys(KeyStore):
    """The real key store, counting its record reads (its own, under ``revoke``, too); the
    next read may be held after it has read Redis (``hold``), or fail before (``failures``)."""

    def __init__(self, redis: RedisClient) -> None:
        super().__init__(redis, PEPPER.encode())
        self.reads = 0
        self.failures = 0
        self.hold: asyncio.Event | None = None
        self.reading = asyncio.Event()

    async def get(self, key_id: str) -> KeyRecord | None:
        self.reads += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionError("Redis went away")
        hold, self.hold = self.hold, None  # only the first read is held
        record = await super().get(key_id)
        self.reading.set()
        if hold is not None:
            await hold.wait()
        return record


@pytest.fixture
async def keys(redis_url: str) -> AsyncIterator[CountedKeys]:
    client = connect_redis(redis_url, timeout_s=2.0)
    try:
        yield CountedKeys(client)
    finally:
        await client.aclose()


@pytest.fixture
async def created(keys: CountedKeys) -> CreatedKey:
    return await keys.create({"name": "cache"})


def authenticator(keys: KeyStore, ttl_s: float) -> Authenticator:
    # model_construct: a TTL past the 1 s an operator may set, so that only the test evicts.
    return Authenticator(keys, AuthSettings.model_construct(cache_ttl_s=ttl_s))


async def test_requests_that_find_the_entry_lapsed_share_one_read(
    keys: CountedKeys, created: CreatedKey
) -> None:
    auth = authenticator(keys, 0.0)  # every request finds the entry lapsed
    bearer = f"Bearer {created.key}"
    first = await asyncio.gather(*(auth.authenticate(bearer) for _ in range(50)))
    assert keys.reads == 1
    assert {p.key_id for p in first} == {created.record.id}
    await asyncio.gather(*(auth.authenticate(bearer) for _ in range(50)))
    assert keys.reads == 2  # the next lapse reads again, once


async def test_a_read_in_flight_when_the_key_changes_is_not_kept(
    keys: CountedKeys, created: CreatedKey
) -> None:
    auth = authenticator(keys, 60.0)
    bearer = f"Bearer {created.key}"
    keys.hold = release = asyncio.Event()
    in_flight = asyncio.create_task(auth.authenticate(bearer))
    await keys.reading.wait()  # it has read the record before the revocation
    await keys.revoke(created.record.id)
    auth.invalidate(created.record.id)  # as the change feed does
    release.set()
    assert (await in_flight).key_id == created.record.id  # admitted as it was when it read
    with pytest.raises(AuthenticationFailed) as refused:
        await auth.authenticate(bearer)
    assert refused.value.code == "key_revoked"
    assert keys.reads == 3  # the shared read, the revocation's own, the read afresh


async def test_a_request_that_leaves_does_not_cancel_the_others_read(
    keys: CountedKeys, created: CreatedKey
) -> None:
    auth = authenticator(keys, 60.0)
    bearer = f"Bearer {created.key}"
    keys.hold = release = asyncio.Event()
    leaving = asyncio.create_task(auth.authenticate(bearer))
    staying = asyncio.create_task(auth.authenticate(bearer))
    await keys.reading.wait()
    leaving.cancel()
    release.set()
    assert (await staying).key_id == created.record.id
    assert leaving.cancelled()
    await auth.authenticate(bearer)  # kept by the shared read
    assert keys.reads == 1


async def test_a_failed_read_fails_its_waiters_and_is_not_kept(
    keys: CountedKeys, created: CreatedKey
) -> None:
    auth = authenticator(keys, 60.0)
    bearer = f"Bearer {created.key}"
    keys.failures = 1
    results = await asyncio.gather(
        *(auth.authenticate(bearer) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, ServiceUnavailable) for r in results)
    assert {r.code for r in results if isinstance(r, ServiceUnavailable)} == {"redis_unavailable"}
    assert keys.reads == 1
    assert (await auth.authenticate(bearer)).key_id == created.record.id
    assert keys.reads == 2
