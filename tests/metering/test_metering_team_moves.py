"""A key that changes teams takes its counters along, exactly: its own requests, tokens and
budget move to the new team's slot, requests reserved before the move settle where they were
taken (their team keeps that spend) and their outcome follows the key, a gateway with an old
record is sent on, and the new home opens only once the counters are there. Real Redis, the
real key store, several clients as replicas."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import redis.asyncio
from redis_helpers import ClientFactory

from gateway.access.keys import KeyRecord, KeyStore
from gateway.access.teams import TeamStore, key_home, team_home
from gateway.metering.limits import HomeChanged, KeyLimits, Limiter, Reservation
from gateway.metering.moves import LimitMoves
from gateway.money import usd_to_nanos

PEPPER = b"test-pepper-0123456789abcdef"
CENT = usd_to_nanos(0.01)
OWN = KeyLimits(budget_nanos=usd_to_nanos(1), budget_period="month")


class _Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@pytest.fixture
def client(clean_redis: str, make_client: ClientFactory) -> redis.asyncio.Redis:
    return make_client(clean_redis)


@pytest.fixture
async def keys(client: redis.asyncio.Redis) -> KeyStore:
    teams = TeamStore(client)
    await teams.create("alpha", {"rpm": 1000, "budgets_nanos": {"day": usd_to_nanos(5)}})
    await teams.create("beta", {"rpm": 1000})
    return KeyStore(client, PEPPER)


def _moves(client: redis.asyncio.Redis, keys: KeyStore, limiter: Limiter) -> LimitMoves:
    return LimitMoves(client, keys, limiter, _Log())


async def _reserve(
    limiter: Limiter, record: KeyRecord, request_id: str, cost: int = 10 * CENT
) -> Reservation:
    return await limiter.reserve(
        record.id,
        OWN,
        tokens=10,
        cost_nanos=cost,
        request_id=request_id,
        home=record.home,
        epoch=record.home_epoch,
    )


async def _key_usage(limiter: Limiter, record: KeyRecord) -> tuple[int, int, int, int]:
    status = await limiter.status(record.id, OWN, home=record.limits_home)
    budget = status["budget"]
    return (
        status["requests"]["used"],
        status["tokens"]["used"],
        budget["spent_nanos"],
        budget["reserved_nanos"],
    )


async def _team_usage(limiter: Limiter, team: str) -> tuple[int, int, int, int]:
    status = await limiter.team_status(
        team, rpm=None, tpm=None, budgets_nanos={"day": usd_to_nanos(5)}, max_parallel=None
    )
    day = status["budgets"]["day"]
    return (
        status["requests"]["used"],
        status["tokens"]["used"],
        day["spent_nanos"],
        day["reserved_nanos"],
    )


async def test_a_key_moving_between_teams_keeps_its_counters(
    client: redis.asyncio.Redis, keys: KeyStore
) -> None:
    limiter = Limiter(client)
    moves = _moves(client, keys, limiter)
    before = (await keys.create({"name": "mover", "team": "alpha"}, home=team_home("alpha"))).record
    held = [await _reserve(limiter, before, f"old{i}") for i in range(3)]

    after = await keys.update(before.id, {"team": "beta"}, home=team_home("beta"))
    assert after is not None and (after.limits_home, after.home_epoch) == ("team:beta", 1)
    # A gateway still holding the old record reserves at the old home until the move is
    # swept; that request is carried over with the rest.
    held.append(await _reserve(limiter, before, "stale-early"))
    with pytest.raises(HomeChanged) as gate:  # the new home is not open yet
        await _reserve(limiter, after, "new-early")
    assert gate.value.moving

    assert not await moves.sweep_key(before.id)  # four requests still hold at alpha
    with pytest.raises(HomeChanged) as stale:
        await _reserve(limiter, before, "stale-late")
    assert not stale.value.moving  # re-read the record: the key lives elsewhere now
    fresh = await _reserve(limiter, after, "new")
    assert await _key_usage(limiter, after) == (5, 50, 0, 50 * CENT)

    for reservation in held:  # the old requests end, at alpha where they were reserved
        assert await limiter.settle(reservation, tokens=4, cost_nanos=6 * CENT)
    assert await moves.sweep_key(before.id)  # carried over, and nothing left at alpha
    assert await _key_usage(limiter, after) == (5, 4 * 4 + 10, 24 * CENT, 10 * CENT)
    # alpha keeps what its requests spent; beta starts from the key's first request there
    assert await _team_usage(limiter, "alpha") == (4, 16, 24 * CENT, 0)
    assert await _team_usage(limiter, "beta") == (1, 10, 0, 0)
    old_scope = limiter.keys(before.id, team_home("alpha"))
    assert await client.exists(*old_scope[:9]) == 0  # the old home's counters are gone
    assert await client.hget(old_scope[9], "left") == b"1"  # its marker stays a while

    # The key's own budget goes on where it was: $1 - $0.24 spent - $0.10 in flight.
    more = []
    for i in range(10):
        try:
            more.append(await _reserve(limiter, after, f"more{i}"))
        except Exception:
            break
    assert len(more) == 6
    await limiter.settle(fresh, tokens=10, cost_nanos=10 * CENT)


async def test_back_and_forth_before_any_sweep_conserves_everything(
    client: redis.asyncio.Redis, keys: KeyStore
) -> None:
    limiter = Limiter(client)
    moves = _moves(client, keys, limiter)
    record = (await keys.create({"team": "alpha"}, home=team_home("alpha"))).record
    held = [await _reserve(limiter, record, f"r{i}") for i in range(2)]
    await keys.update(record.id, {"team": "beta"}, home=team_home("beta"))
    back = await keys.update(record.id, {"team": "alpha"}, home=team_home("alpha"))
    assert back is not None and (back.limits_home, back.home_epoch) == ("team:alpha", 2)
    with pytest.raises(HomeChanged):  # home again, but opened only by the move back
        await _reserve(limiter, back, "early")
    await moves.sweep_key(record.id)
    assert await _key_usage(limiter, back) == (2, 20, 0, 20 * CENT)
    for reservation in held:
        await limiter.settle(reservation, tokens=10, cost_nanos=3 * CENT)
    assert await moves.sweep_key(record.id)
    assert await _key_usage(limiter, back) == (2, 20, 6 * CENT, 0)
    assert await _team_usage(limiter, "alpha") == (2, 20, 6 * CENT, 0)
    assert await client.zcard(f"sy:{{key:{record.id}}}:moves") == 0


async def test_concurrent_sweepers_and_settles_count_each_amount_once(
    client: redis.asyncio.Redis, keys: KeyStore, clean_redis: str, make_client: ClientFactory
) -> None:
    replicas = [Limiter(make_client(clean_redis)) for _ in range(3)]
    sweepers = [_moves(make_client(clean_redis), keys, limiter) for limiter in replicas]
    record = (await keys.create({"team": "alpha"}, home=team_home("alpha"))).record
    held = [await _reserve(replicas[i % 3], record, f"r{i}", 3 * CENT) for i in range(30)]
    moved = await keys.update(record.id, {"team": "beta"}, home=team_home("beta"))
    assert moved is not None
    costs = [random.Random(i).randrange(0, 4) * CENT for i in range(30)]
    done = asyncio.Event()

    async def sweep(moves: LimitMoves) -> None:
        while not done.is_set():
            await moves.sweep_key(record.id)
            await asyncio.sleep(0)

    async def settle_all() -> None:
        order = list(range(30))
        random.Random(7).shuffle(order)
        for i in order:
            await replicas[i % 3].settle(held[i], tokens=3, cost_nanos=costs[i])
            await asyncio.sleep(0)
        done.set()

    await asyncio.gather(settle_all(), *(sweep(m) for m in sweepers))
    assert await sweepers[0].sweep_key(record.id)
    assert await _key_usage(replicas[0], moved) == (30, 90, sum(costs), 0)
    assert await _team_usage(replicas[0], "alpha") == (30, 90, sum(costs), 0)


async def test_a_key_of_no_team_joins_a_team_with_its_spend(
    client: redis.asyncio.Redis, keys: KeyStore
) -> None:
    limiter = Limiter(client)
    record = (await keys.create({"name": "solo"})).record
    assert record.limits_home == key_home(record.id)
    spent = await _reserve(limiter, record, "solo1")
    await limiter.settle(spent, tokens=10, cost_nanos=40 * CENT)
    joined = await keys.update(record.id, {"team": "alpha"}, home=team_home("alpha"))
    assert joined is not None
    assert await _moves(client, keys, limiter).sweep_key(record.id)
    assert await _key_usage(limiter, joined) == (1, 10, 40 * CENT, 0)
    assert await client.exists(f"sy:{{key:{record.id}}}:budget:month") == 0
    assert await _team_usage(limiter, "alpha") == (0, 0, 0, 0)  # not the team's spend
