"""SWITCHYARD_REDIS_URL forms: single node, unix socket, cluster seed lists, and clear errors."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from gateway.settings import SettingsError, load_settings
from gateway.store.connect import RedisUrlError, check_redis_url, connect_redis, is_cluster_url


@pytest.mark.parametrize(
    "url",
    [
        "",
        "redis://127.0.0.1:6379/0",
        "rediss://user:secret@redis.internal:6380/2",
        "unix:///var/run/redis.sock?db=0",
        "redis+cluster://10.0.0.1:7000",
        "redis+cluster://10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000/0",
        "rediss+cluster://default:p%40ss@[::1]:7000",
    ],
)
def test_accepted_urls(url: str) -> None:
    check_redis_url(url)
    assert load_settings(redis_url=url, _env_file=None).redis_url == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://redis:6379", "must start with redis://"),
        ("localhost:6379", "must start with redis://"),
        ("redis://", "names no host"),
        ("redis://host:notaport", "bad port"),
        ("unix://", "socket path"),
        ("redis+cluster://", "at least one seed"),
        ("redis+cluster://10.0.0.1", "must be host:port"),
        ("redis+cluster://10.0.0.1:0", "out of range"),
        ("redis+cluster://10.0.0.1:70000", "out of range"),
        ("redis+cluster://10.0.0.1:x", "bad port"),
        ("redis+cluster://10.0.0.1:7000/3", "only database 0"),
        ("redis+cluster://10.0.0.1:7000?read_from_replicas=1", "not supported"),
    ],
)
def test_bad_urls_say_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(RedisUrlError, match=message):
        check_redis_url(url)
    with pytest.raises(SettingsError, match="SWITCHYARD_REDIS_URL") as caught:
        load_settings(redis_url=url, _env_file=None)
    assert message in str(caught.value)


async def test_client_kind_follows_the_scheme() -> None:
    single = connect_redis("redis://127.0.0.1:1/0", timeout_s=0.5)
    cluster = connect_redis("redis+cluster://127.0.0.1:1,127.0.0.2:2", timeout_s=0.5)
    try:
        assert isinstance(single, Redis)
        assert isinstance(cluster, RedisCluster)
        seeds = {(node.host, node.port) for node in cluster.nodes_manager.startup_nodes.values()}
        assert seeds == {("127.0.0.1", 1), ("127.0.0.2", 2)}
        assert is_cluster_url("REDIS+CLUSTER://h:1") and not is_cluster_url("redis://h:1")
    finally:
        await single.aclose()
        await cluster.aclose()
