"""A real Sentinel setup for failover tests: a primary, a replica (or more) and three sentinels, from
the embedded ``valkey-server`` binary on free loopback ports under a temporary directory.

The data servers keep an append-only file (``appendfsync everysec``). ``down-after-milliseconds`` is
1000 and ``failover-timeout`` 2000, so a killed primary is replaced within a few seconds.
``kill_primary()`` SIGKILLs the current primary (no shutdown, no last write); ``stop()`` kills every
process the cluster started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from runtime.valkey.embedded import free_port, ping, valkey_binary

MASTER_NAME = "dispatchmaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 2000


@dataclass
class SentinelCluster:
    root: Path
    replicas: int = 1
    data_ports: list[int] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)  # by port

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"valkey+sentinel://{hosts}/{MASTER_NAME}/0"

    def _spawn(self, port: int, args: list[str], name: str) -> None:
        work = self.root / name
        work.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [valkey_binary(), *args, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work),
             "--save", "", "--logfile", str(work / "log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip

    def _wait_ping(self, port: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ping(port):
            if self.procs[port].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"valkey on port {port} did not start; see {self.root}")
            time.sleep(0.02)

    def start(self) -> None:
        primary = free_port()
        self.data_ports = [primary, *(free_port() for _ in range(self.replicas))]
        # As the embedded server runs: an append-only file fsynced every second, so a durable group's
        # WAITAOF (with persist_replicas, on the replica too) is answered.
        # A replica syncs at once instead of after the default 5 s wait for more replicas to share the sync.
        aof = ["--appendonly", "yes", "--appendfsync", "everysec", "--repl-diskless-sync-delay", "0"]
        self._spawn(primary, aof, f"data-{primary}")
        for replica in self.data_ports[1:]:
            self._spawn(replica, [*aof, "--replicaof", "127.0.0.1", str(primary)], f"data-{replica}")
        for port in self.data_ports:
            self._wait_ping(port)
        self.wait_replicated(primary, timeout_s=10.0)
        for _ in range(3):
            port = free_port()
            self.sentinel_ports.append(port)
            conf = self.root / f"sentinel-{port}.conf"
            # Sentinel rewrites its config file as state changes, so each has a writable one of its own.
            conf.write_text(
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
            self._spawn(port, [str(conf), "--sentinel"], f"sentinel-{port}")
        for port in self.sentinel_ports:
            self._wait_ping(port)
        self.wait_sentinels_agree(primary)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2.0, decode_responses=True)

    def master_port(self) -> int | None:
        """The primary the sentinels name now (the first that answers)."""
        for port in self.sentinel_ports:
            if self.procs[port].poll() is not None:
                continue
            try:
                with self.client(port) as sentinel:
                    address = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
            except redis.RedisError:
                continue
            if address:
                return int(address[1])
        return None

    def wait_sentinels_agree(self, primary: int, timeout_s: float = 20.0) -> None:
        """Until every sentinel names ``primary`` and knows the other two sentinels and the replica."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready = 0
            for port in self.sentinel_ports:
                with self.client(port) as sentinel:
                    state = sentinel.execute_command("SENTINEL", "MASTER", MASTER_NAME)
                info = dict(zip(state[::2], state[1::2], strict=True)) if isinstance(state, list) else state
                if (
                    int(info["port"]) == primary
                    and int(info["num-other-sentinels"]) == 2
                    and int(info["num-slaves"]) >= self.replicas
                ):
                    ready += 1
            if ready == len(self.sentinel_ports):
                return
            time.sleep(0.05)
        raise RuntimeError(f"sentinels did not agree on primary {primary} in {timeout_s}s; see {self.root}")

    def wait_replicated(self, primary: int, timeout_s: float = 10.0) -> None:
        """Until the primary has its replicas online (synced, so WAIT and WAITAOF can count them)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.client(primary) as client:
                info = client.info("replication")
            online = [
                key
                for key, value in info.items()
                if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
            ]
            if len(online) >= self.replicas:
                return
            time.sleep(0.02)
        raise RuntimeError(f"replica did not connect to {primary} in {timeout_s}s; see {self.root}")

    def kill_primary(self) -> int:
        """SIGKILLs the current primary; returns its port."""
        port = self.master_port()
        assert port is not None, "no primary to kill"
        proc = self.procs[port]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        return port

    def wait_failover(self, old: int, timeout_s: float = 30.0) -> int:
        """Until the sentinels name a primary other than ``old`` that accepts writes; its port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.master_port()
            if port is not None and port != old:
                try:
                    with self.client(port) as client:
                        if client.info("replication")["role"] == "master":
                            return port
                except redis.RedisError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"no failover away from {old} in {timeout_s}s; see {self.root}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


@pytest.fixture
def sentinel_cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    cluster = SentinelCluster(tmp_path / "sentinel")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
