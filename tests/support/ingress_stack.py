"""A real ingress stack as separate processes: the simulator, a dispatcher, daphne serving the ASGI app.

The configuration database is a private SQLite under the stack's directory; groups, pools and keys are
made through ``manage.py`` exactly as an operator's scripts would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from runtime.queue.keys import KeySpace
from runtime.valkey.embedded import free_port
from tests.support.waiting import port_open, wait_for_start, wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
GROUP = "ing"
# pool id -> (weight, max concurrent, has an endpoint)
POOLS = {
    "gold": (3, 2, True),
    "iron": (1, 2, True),
    "solo": (1, 1, True),
}
SETUP = """
from pools import services
from pools.models import Backend, FabricGroup, Pool
group = FabricGroup.objects.create(group_id={group!r}, policy="drr", total_concurrency=2)
backend = Backend.objects.create(backend_id="ing-sim", base_url={endpoint!r})
for i, (pool_id, (quantum, most, has_endpoint)) in enumerate({pools!r}.items()):
    Pool.objects.create(group=group, pool_id=pool_id, quantum=quantum, max_concurrent=most, sort_order=i,
                        backend=backend if has_endpoint else None)
Pool.objects.create(group=group, pool_id="dormant", enabled=False, sort_order=9)
assert services.group_publish(group=group).ok
"""
# Added once the dispatcher runs: its start-up checks refuse a pool without an endpoint.
ADD_POOL_WITHOUT_ENDPOINT = """
from pools import services
from pools.models import FabricGroup, Pool
group = FabricGroup.objects.get(group_id={group!r})
services.pool_save(pool=Pool(group=group, pool_id="noend", sort_order=5))
"""


@dataclass
class Stack:
    root: Path
    env: dict[str, str]
    sim_url: str
    valkey_url: str
    keys: KeySpace
    url: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"manage.py {args[0]} failed: {done.stderr}"
        return done.stdout

    def create_key(self, name: str, pools: str, *extra: str) -> str:
        """A new producer key, read from the last line ``create_producer_key`` prints."""
        return self.manage("create_producer_key", name, "--pools", pools, *extra).strip().splitlines()[-1]

    def revoke(self, name: str) -> None:
        self.manage(
            "shell", "-c",
            f"from ingress import services; from ingress.models import ProducerKey; "
            f"services.producer_key_revoke(key=ProducerKey.objects.get(name={name!r}))",
        )  # fmt: skip

    def start(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start_web(self, name: str = "daphne") -> tuple[str, subprocess.Popen[bytes]]:
        """One more web process (daphne serving the ASGI app, so one more ingress producer); its URL."""
        port = free_port()
        web = self.start(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "dispatch_project.asgi:application"], name,
        )  # fmt: skip
        try:
            wait_for_start(lambda: port_open(port), web, what=f"{name} listening")
        except AssertionError:
            raise AssertionError((self.root / f"{name}.log").read_text()) from None
        return f"http://127.0.0.1:{port}", web

    def set_paused(self, paused: bool, *pool_ids: str) -> None:
        self.manage(
            "shell", "-c",
            f"from pools import services; from pools.models import Pool; services.pool_set_paused("
            f"pools=Pool.objects.filter(pool_id__in={list(pool_ids)!r}), paused={paused!r})",
        )  # fmt: skip

    def counter(self, name: str) -> int:
        with self.valkey() as client:
            return int(client.hget(self.keys.counters(GROUP), name) or 0)

    def queued(self, pool_id: str) -> int:
        with self.valkey() as client:
            return int(client.llen(self.keys.requests(pool_id)))

    def valkey(self) -> redis.Redis:
        return redis.Redis.from_url(self.valkey_url)

    def sim_count(self, path: str = "/v1/chat/completions") -> int:
        """Requests the simulator received on ``path``, from its Prometheus counters."""
        text = httpx.get(f"{self.sim_url}/metrics").text
        prefix = f'sim_requests_total{{path="{path}"}} '
        return next(
            (int(float(line[len(prefix) :])) for line in text.splitlines() if line.startswith(prefix)), 0
        )

    def sim_running(self) -> int:
        text = httpx.get(f"{self.sim_url}/metrics").text
        line = next(line for line in text.splitlines() if line.startswith("vllm:num_requests_running"))
        return int(float(line.rsplit(" ", 1)[1]))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def start_stack(
    root: Path, valkey_url: str, prefix: str, *sim_args: str, env: Mapping[str, str] | None = None
) -> Stack:
    """``env`` adds to (or overrides) every process's environment."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "dispatch_project.settings",
        "DISPATCH_DATA_DIR": str(root),
        "VALKEY_URL": valkey_url,
        "DISPATCH_KEY_PREFIX": prefix,
        "DISPATCH_LOG_LEVEL": "WARNING",
        **(env or {}),
    }
    sim_port = free_port()
    stack = Stack(root, env, f"http://127.0.0.1:{sim_port}", valkey_url, KeySpace(prefix))
    try:
        sim = stack.start(
            [
                sys.executable,
                "-m",
                "simulator",
                "--port",
                str(sim_port),
                "--latency-ms",
                "5",
                *sim_args,
            ],
            "sim",
        )
        stack.manage("migrate", "-v", "0")
        stack.manage("shell", "-c", SETUP.format(group=GROUP, pools=POOLS, endpoint=f"{stack.sim_url}/v1"))
        stack.start([sys.executable, "manage.py", "rundispatcher", "--group", GROUP, "--grace", "1"], "disp")
        url, web = stack.start_web()
        wait_until_sync(lambda: port_open(sim_port) or sim.poll() is not None, 20, what="simulator up")
        with stack.valkey() as client:
            pattern = stack.keys.snapshot_pattern(GROUP)
            wait_until_sync(lambda: client.keys(pattern), 30, what="the dispatcher's first snapshot")
        stack.manage("shell", "-c", ADD_POOL_WITHOUT_ENDPOINT.format(group=GROUP))
        assert web.poll() is None, (root / "daphne.log").read_text()
        stack.url = url
        return stack
    except BaseException:
        stack.stop()
        raise
