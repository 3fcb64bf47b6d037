"""A real Redis Cluster on free loopback ports, started by the tests themselves: three masters,
each with one replica (``redis-server --cluster-enabled yes`` x6, ``redis-cli --cluster create``).

Every node keeps an append-only file (``appendfsync always``) and has its own directory; the
cluster bus of a node listens on its port + 10000, which is checked free too.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from tests.redis_server import INSTALL_HINT, REDIS_SERVER
from tests.server import free_port

REDIS_CLI = shutil.which("redis-cli")
BUS_OFFSET = 10_000


def _bus_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port + BUS_OFFSET))
        except OSError:
            return False
    return True


class ClusterNode:
    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        while not _bus_free(port):
            port = free_port()
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000", "--save", "", "--appendonly", "yes",
                "--appendfsync", "always", "--dir", str(self.dir), "--daemonize", "no",
                "--logfile", "redis.log",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, socket_timeout=5)

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None


class RedisClusterServers:
    """Six nodes: three masters with one replica each."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        if REDIS_SERVER is None or REDIS_CLI is None:
            raise RuntimeError(INSTALL_HINT)
        self.nodes = [ClusterNode(Path(directory) / f"node{i}") for i in range(masters * 2)]
        self.masters = masters

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    def start(self, timeout: float = 30) -> RedisClusterServers:
        assert REDIS_CLI is not None
        for node in self.nodes:
            node.start()
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            client = node.client()
            while True:
                try:
                    if client.ping():
                        break
                except redis.exceptions.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cluster node on port {node.port} did not answer")
                time.sleep(0.05)
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=timeout,
        )
        self.wait_ok(deadline)
        return self

    def wait_ok(self, deadline: float) -> None:
        """Until every running node says ``cluster_state:ok``, knows every slot and sees each
        master with its replica."""
        for node in self.nodes:
            if node.proc is None:
                continue
            client = node.client()
            while True:
                info = client.cluster("info")
                replicas = sum("slave" in n["flags"] for n in client.cluster("nodes").values())
                if (info.get("cluster_state") == "ok" and int(info.get("cluster_slots_ok", 0)) == 16384
                        and replicas == self.masters):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"cluster not ok on port {node.port}: {info}")
                time.sleep(0.1)

    def node_for(self, key: str, *, master: bool = True) -> ClusterNode:
        """The node serving ``key``'s slot now: its master, or (``master=False``) a replica of it."""
        probe = next(n for n in self.nodes if n.proc is not None).client()
        slot = int(probe.cluster("keyslot", key))
        nodes = probe.cluster("nodes")
        for address, node in nodes.items():
            if "master" in node["flags"] and any(int(lo) <= slot <= int(hi or lo) for lo, hi, *_ in
                                                 ([*r, None] for r in node["slots"])):
                if not master:
                    address = next(a for a, n in nodes.items() if n["master_id"] == node["node_id"])
                port = int(address.rsplit(":", 1)[1])
                return next(n for n in self.nodes if n.port == port)
        raise LookupError(slot)

    def failover(self, key: str, timeout: float = 30) -> tuple[ClusterNode, ClusterNode]:
        """Promote the replica of the master holding ``key`` (``CLUSTER FAILOVER``: the replica
        catches up with its master first, then takes over); returns (old master, new master)."""
        old, new = self.node_for(key), self.node_for(key, master=False)
        new.client().execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout
        while self.node_for(key).port != new.port:
            if time.monotonic() > deadline:
                raise TimeoutError("the failover did not complete")
            time.sleep(0.1)
        self.wait_ok(deadline)
        return old, new

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
