"""The windows' running totals (limits_windows.lua) always equal the sum of their live
sub-buckets, whatever the order of takes, refunds, slides and clock steps; a hash written before
the totals existed is summed once and then kept."""

from __future__ import annotations

import random

import pytest
from redis_helpers import ClientFactory

from gateway.metering.limits import script_source

BUCKETS = 60
BUCKET_MS = 1000
KEY = "sy:{key:w}:rpm"

# ARGV: 1 sub-bucket now, 2 sub-bucket to add to (or '-'), 3 amount, 4 take back at most what
# the sub-bucket holds ('1') or exactly ('0'). Returns the window's total after the call.
_PROBE = """
local cur, target, amount = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = cur * 1000 + 500
local wanted = nil
if target and target ~= cur then
  wanted = {target}
end
local w = window_open(KEYS[1], cur, 60, wanted)
if target and target >= cur - 60 + 1 then
  if ARGV[4] == '1' then
    amount = -math.min(window_amount(w, target), -amount)
  end
  if amount ~= 0 then
    window_add(w, target, amount)
  end
end
window_save(w, now, 1000)
return w.total
"""


def _source() -> str:
    prelude = script_source("limits_status.lua").split("-- Current usage")[0]
    return prelude + _PROBE


def _live_sum(fields: dict[bytes, bytes], cur: int) -> int:
    """What the window holds by definition: the sub-buckets still in it."""
    return sum(
        int(amount)
        for name, amount in fields.items()
        if name.lstrip(b"-").isdigit() and int(name) >= cur - BUCKETS + 1
    )


@pytest.mark.parametrize("seed", range(6))
async def test_total_is_the_sum_of_the_live_sub_buckets(
    seed: int, clean_redis: str, make_client: ClientFactory
) -> None:
    client = make_client(clean_redis)
    source = _source()
    rng = random.Random(seed)
    cur = 1_000_000
    for _ in range(400):
        step = rng.random()
        if step < 0.25:
            cur += rng.choice([1, 1, 2, 5, 30, 59, 61, 200])  # time passes, sometimes a lot
        elif step < 0.28:
            cur -= rng.choice([1, 3])  # the server clock steps back a little
        if rng.random() < 0.6:
            target, amount, capped = cur, rng.randint(1, 50), "0"  # a take now
        else:  # a refund to a sub-bucket of the last minute, never below zero (or exact)
            target = cur - rng.randint(0, BUCKETS + 5)
            amount, capped = -rng.randint(1, 60), rng.choice(["1", "1", "0"])
        total = await client.eval(source, 1, KEY, cur, target, amount, capped)
        fields = await client.hgetall(KEY)
        assert total == _live_sum(fields, cur)
        if fields:
            assert int(fields[b"total"]) == total
            assert int(fields[b"oldest"]) <= min(
                (int(n) for n in fields if n.lstrip(b"-").isdigit()), default=cur
            )
            assert await client.pttl(KEY) > 0


async def test_a_hash_from_before_the_totals_is_summed_once(
    clean_redis: str, make_client: ClientFactory
) -> None:
    client = make_client(clean_redis)
    source = _source()
    cur = 2_000_000
    old = {str(cur - b): b + 1 for b in range(0, 90, 3)}  # 30 sub-buckets, 20 of them live
    await client.hset(KEY, mapping=old)
    live = sum(v for k, v in old.items() if int(k) > cur - BUCKETS)
    assert await client.eval(source, 1, KEY, cur, "-", 0, "0") == live
    fields = await client.hgetall(KEY)
    # the running fields come first; the sub-buckets that slid out are gone
    assert list(fields)[:3] == [b"total", b"oldest", b"newest"]
    assert len(fields) == 3 + 20
    assert int(fields[b"newest"]) == cur
    assert 0 < await client.pttl(KEY) <= (BUCKETS + 1) * BUCKET_MS
    # from now on the running fields are kept: 3 s later the sub-bucket of 57 s ago (58) left
    assert await client.eval(source, 1, KEY, cur + 3, cur + 3, 5, "0") == live - 58 + 5
