"""A Redis Cluster and a Sentinel-managed master on loopback, for the scale-out tests.

Debian's redis-server, each node with its own directory and config file, free ports only
(the cluster bus port is set with `cluster-port`, not left at port + 10000, which may be
taken). Every process is started through zccp.ops.stack.Service and stopped by `stop()`;
every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from zccp.ops.stack import Service, StackError, free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
# Debian's redis-sentinel package (scripts/setup.sh): the same binary started as Sentinel
REDIS_SENTINEL = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0, every: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(every)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


@dataclass
class Node:
    """One redis-server (a cluster node, a master, a replica or a sentinel) with its own dir."""

    name: str
    run_dir: Path
    settings: list[str]
    sentinel: bool = False
    port: int = field(default_factory=free_port)
    service: Service | None = field(default=None, init=False)

    @property
    def dir(self) -> Path:
        return self.run_dir / self.name

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Node:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "redis.conf"
        if not conf.exists():   # a restart keeps the file (a sentinel rewrites it)
            conf.write_text("\n".join([f"port {self.port}", "bind 127.0.0.1", f"dir {self.dir}", "daemonize no",
                                       'save ""', "appendonly no", *self.settings]) + "\n")
        cmd = [REDIS_SENTINEL if self.sentinel else REDIS_SERVER, str(conf)]
        self.service = Service(self.name, cmd, self.dir / "redis.log")
        self.service.start()
        self.service.wait_until(self._pong, 15, f"PING on {self.addr}")
        return self

    def _pong(self) -> bool:
        try:
            return bool(self.call("PING"))
        except redis.RedisError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, socket_connect_timeout=5)

    def call(self, *args: str | int) -> object:
        with self.client() as c:
            return c.execute_command(*args)

    def replication(self) -> dict:
        with self.client() as c:
            return c.info("replication")

    def pause(self) -> None:
        """SIGSTOP: a node that holds its connections open and answers nothing."""
        assert self.service is not None and self.service.proc is not None
        os.kill(self.service.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.service is not None and self.service.proc is not None
        os.kill(self.service.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.service is not None:
            if self.service.alive:
                self.resume()   # a paused process never handles SIGTERM
            self.service.stop()


@dataclass
class LocalCluster:
    """N masters, no replicas, all 16384 slots assigned by `redis-cli --cluster create`."""

    run_dir: Path
    masters: int = 3
    nodes: list[Node] = field(default_factory=list, init=False)

    def start(self) -> LocalCluster:
        try:
            for i in range(self.masters):
                self.nodes.append(Node(f"cluster{i}", self.run_dir, [
                    "cluster-enabled yes", "cluster-config-file nodes.conf", f"cluster-port {free_port()}",
                    "cluster-node-timeout 15000"]).start())
            out = subprocess.run([REDIS_CLI, "--cluster", "create", *(n.addr for n in self.nodes), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                raise StackError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout: float = 60.0) -> None:
        """Every node says `cluster_state:ok` and knows every other node."""
        def ok() -> bool:
            for n in self.nodes:
                info = n.call("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or f"cluster_known_nodes:{len(self.nodes)}" not in text:
                    return False
            return True
        wait_for("cluster_state:ok on every node", ok, timeout)

    def url(self, startup: int | None = None) -> str:
        """cache.redis_url for this cluster, naming the first `startup` nodes (all by default)."""
        return "redis+cluster://" + ",".join(n.addr for n in self.nodes[:startup])

    def node_for(self, key: str) -> Node:
        slot = int(self.nodes[0].call("CLUSTER", "KEYSLOT", key))   # type: ignore[arg-type]
        for lo, hi, master, *_ in self.nodes[0].call("CLUSTER", "SLOTS"):   # type: ignore[union-attr]
            if lo <= slot <= hi:
                return next(n for n in self.nodes if n.port == int(master[1]))
        raise AssertionError(f"no node serves slot {slot}")

    def keys(self, pattern: str = "zccp:*") -> dict[str, list[bytes]]:
        """The keys matching `pattern` on each node (node name -> keys)."""
        out = {}
        for n in self.nodes:
            with n.client() as c:
                out[n.name] = list(c.scan_iter(match=pattern, count=1000))
        return out

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


@dataclass
class LocalSentinel:
    """One master, one replica and one sentinel watching them (quorum 1)."""

    run_dir: Path
    service_name: str = "zccp-main"
    master: Node = field(init=False)
    replica: Node = field(init=False)
    sentinel: Node = field(init=False)

    def start(self) -> LocalSentinel:
        no_delay = ["repl-diskless-sync-delay 0"]     # a replica's first sync starts at once, not after 5 s
        self.master = Node("master", self.run_dir, no_delay)
        self.replica = Node("replica", self.run_dir, no_delay)
        self.sentinel = Node("sentinel", self.run_dir, [], sentinel=True)
        self.replica.settings = [*no_delay, f"replicaof 127.0.0.1 {self.master.port}"]
        self.sentinel.settings = [f"sentinel monitor {self.service_name} 127.0.0.1 {self.master.port} 1",
                                  f"sentinel down-after-milliseconds {self.service_name} 10000",
                                  f"sentinel failover-timeout {self.service_name} 20000"]
        try:
            self.master.start()
            self.replica.start()
            wait_for("the replica in sync", lambda: self.replica.replication().get("master_link_status") == "up")
            self.sentinel.start()
            wait_for("the sentinel knows the replica", self._sentinel_sees_replica)
        except BaseException:
            self.stop()
            raise
        return self

    def _sentinel_sees_replica(self) -> bool:
        with self.sentinel.client() as c:
            return any(int(r["port"]) == self.replica.port for r in c.sentinel_slaves(self.service_name))

    def url(self, db: int = 0) -> str:
        return f"redis+sentinel://{self.sentinel.addr}/{self.service_name}/{db}"

    def master_port(self) -> int:
        with self.sentinel.client() as c:
            _, port = c.sentinel_get_master_addr_by_name(self.service_name)
        return int(port)

    def current_master(self) -> Node:
        port = self.master_port()
        return self.master if port == self.master.port else self.replica

    def failover(self, timeout: float = 60.0) -> Node:
        """SENTINEL FAILOVER: the replica becomes the master; returns the new master once the
        sentinel names it, it says role:master, and the old master replicates from it."""
        old = self.current_master()
        new = self.replica if old is self.master else self.master
        with old.client() as c:     # everything written so far has reached the replica
            c.execute_command("WAIT", 1, 5000)
        self.sentinel.call("SENTINEL", "FAILOVER", self.service_name)
        wait_for("the sentinel names the new master", lambda: self.master_port() == new.port, timeout)
        wait_for("the new master says role:master", lambda: new.replication()["role"] == "master", timeout)
        # Sentinel turns the old master into a replica at its next INFO round (every 10 s)
        wait_for("the old master replicates from the new one",
                 lambda: old.replication().get("master_link_status") == "up", timeout)
        return new

    def stop(self) -> None:
        for n in (getattr(self, "sentinel", None), getattr(self, "replica", None), getattr(self, "master", None)):
            if n is not None:
                n.stop()
