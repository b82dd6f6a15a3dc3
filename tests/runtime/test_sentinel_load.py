"""SIGKILL the Valkey primary under load: a real ``rundispatcher`` process and a producer, both given the
sentinel URL, carry on with the promoted replica without a restart.

Replication is asynchronous: a push the primary acknowledged may die with it before its replica has it,
unless the group waits for a replica on each push (``persist_replicas``, WAITAOF): the durable group
here does, so every request whose push was acknowledged gets exactly one reply.
"""

from __future__ import annotations

import asyncio
import collections
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from runtime.errors import DispatchError, QueueUnavailable, RequestTimeout
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from runtime.valkey.client import ValkeyClient, connect
from runtime.wire.groupconfig import DURABLE, LISTS
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.durable import keyed
from tests.support.ingress_stack import Stack
from tests.support.key_recorder import KeyRecorder
from tests.support.sentinel_cluster import SentinelCluster
from tests.support.waiting import started, wait_until

SETUP = """
from pools.models import Backend, FabricGroup, Pool
backend = Backend.objects.create(backend_id="sim", base_url={endpoint!r})
group = FabricGroup.objects.create(group_id="g", policy="fifo", total_concurrency=64, delivery={delivery!r},
                                   backend=backend, persist_replicas={replicas})
Pool.objects.create(group=group, pool_id="default", max_concurrent=64)
"""
WORKERS = 8
LATENCY_MS = 200


@pytest.fixture
async def backend() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(SimulatorConfig()) as server:
        yield server


def dispatcher_stack(
    root: Path, cluster: SentinelCluster, keys: KeySpace, endpoint: str, delivery: str
) -> Stack:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "dispatch_project.settings",
        "DISPATCH_DATA_DIR": str(root),
        "VALKEY_URL": cluster.url,
        "DISPATCH_KEY_PREFIX": keys.prefix,
        "DISPATCH_LEASE_S": "3",
        "DISPATCH_VALKEY_HEALTH_S": "2",
        "DISPATCH_LOG_LEVEL": "WARNING",
    }
    # A database of the stack's own (SQLite under its data directory): a run against DATABASE_URL must
    # not see another test's rows (the parametrized cases each create backend "sim").
    env.pop("DATABASE_URL", None)
    stack = Stack(root=root, env=env, sim_url=endpoint, valkey_url=cluster.url, keys=keys)
    stack.manage("migrate", "-v", "0")
    replicas = 1 if delivery == DURABLE else 0  # a durable push is acknowledged once the replica has it
    stack.manage("shell", "-c", SETUP.format(endpoint=endpoint, delivery=delivery, replicas=replicas))
    stack.start([sys.executable, "manage.py", "rundispatcher", "--group", "g", "--grace", "1"], "dispatcher")
    return stack


async def dispatcher_running(client: ValkeyClient, keys: KeySpace, stack: Stack) -> None:
    """Waits for the dispatcher process's first snapshot, the sign that its loop runs."""
    await started(lambda: client.keys(keys.snapshot_pattern("g")), stack.procs[0], what="the dispatcher")


class Load:
    """Workers submitting one request after another; every outcome kept by request id."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.outcomes: dict[str, str] = {}  # "ok" or the error's type
        self.completed_at: dict[str, float] = {}
        self.stop = asyncio.Event()

    async def worker(self, worker: int) -> None:
        for i in range(10**6):
            if self.stop.is_set():
                return
            rid = f"w{worker}-{i}"
            try:
                await self.producer.submit(
                    keyed(rid, latency_ms=LATENCY_MS), pool_id="default", timeout=20, request_id=rid
                )
                self.outcomes[rid] = "ok"
                self.completed_at[rid] = time.monotonic()
            except DispatchError as exc:
                self.outcomes[rid] = type(exc).__name__
                if isinstance(exc, QueueUnavailable):
                    await asyncio.sleep(0.1)  # the scenario: a caller backing off while Valkey fails over

    def completed_since(self, moment: float) -> int:
        return sum(1 for at in self.completed_at.values() if at > moment)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("delivery", [DURABLE, LISTS])
async def test_the_primary_dies_under_load_and_traffic_resumes_on_the_promoted_replica(
    sentinel_cluster: SentinelCluster, tmp_path: Path, keys: KeySpace, backend: SimulatorServer, delivery: str
) -> None:
    cluster = sentinel_cluster
    stack = dispatcher_stack(tmp_path, cluster, keys, f"{backend.url}", delivery)
    client = connect(cluster.url, health_s=2.0)
    try:
        async with Producer(client, keys=keys) as producer:
            load = Load(producer)
            # The dispatcher process's start-up (Django, its checks) took 12 s of the 60 s below at load
            # 10: the traffic's deadline starts once it runs.
            await dispatcher_running(client, keys, stack)
            workers = [asyncio.create_task(load.worker(w)) for w in range(WORKERS)]
            await wait_until(lambda: load.completed_since(0) >= 30, timeout=60, what="30 completions")
            # Acknowledged so far: each push was answered once the replica had it too.
            assert producer.stats.unpersisted_pushes == 0
            old = cluster.kill_primary()
            killed_at = time.monotonic()
            new = await asyncio.to_thread(cluster.wait_failover, old)  # the loop runs the backend
            await wait_until(
                lambda: load.completed_since(killed_at) >= 30,
                timeout=60,
                what="30 completions after the kill",
            )
            load.stop.set()
            await asyncio.gather(*workers)
            assert producer.stats.duplicate_replies == 0

        outcomes = load.outcomes
        assert all(outcome in ("ok", "QueueUnavailable", "RequestTimeout") for outcome in outcomes.values())
        lost = {rid for rid, outcome in outcomes.items() if outcome == RequestTimeout.__name__}
        assert producer.stats.timed_out == len(lost)  # a loss is counted, never silent
        if delivery == DURABLE:
            # Acknowledged: exactly one reply each. Refused (QueueUnavailable, while the failover ran):
            # the caller knows to submit again. (The new primary has no replica left: its pushes are
            # acknowledged when WAITAOF gives up, counted unpersisted.)
            assert lost == set()
            done = [rid for rid, outcome in outcomes.items() if outcome == "ok"]
            assert all(1 <= backend.calls_by_key[rid] <= 2 for rid in done)
        # The same dispatcher process, now talking to the new primary, says so in its snapshot.
        dispatcher = stack.procs[0]
        assert dispatcher.poll() is None, (tmp_path / "dispatcher.log").read_text()

        async def snapshot_names_the_new_primary() -> bool:
            for key in await client.keys(keys.snapshot_pattern("g")):
                raw = await client.get(key)
                if raw and orjson.loads(raw).get("valkey") == f"127.0.0.1:{new}":
                    return True
            return False

        await wait_until(
            snapshot_names_the_new_primary, timeout=20, what="the snapshot naming the new primary"
        )
    finally:
        stack.stop()
        await client.aclose()


IN_FLIGHT = 8


class GatedBackend(KeyRecorder):
    """An OpenAI-compatible backend holding every answer until ``gate`` opens: the calls end at a
    chosen moment (right after the kill, while no primary exists). Calls are counted by message."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.calls: collections.Counter[str] = collections.Counter()

    async def _chat(self, request: web.Request) -> web.Response:
        self.calls[(await request.json())["messages"][0]["content"]] += 1
        await self.gate.wait()
        return await super()._chat(request)


def acknowledged_pushes(producer: Producer) -> set[str]:
    """The request ids whose push Valkey has acknowledged (filled as the producer's pushes return)."""
    done: set[str] = set()
    push = producer._enqueue.push

    async def recorded(pool_id: str, request_id: str, *args: object) -> None:
        await push(pool_id, request_id, *args)  # type: ignore[arg-type]
        done.add(request_id)

    producer._enqueue.push = recorded  # type: ignore[method-assign]
    return done


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("delivery", [DURABLE, LISTS])
async def test_calls_that_finish_during_the_failover_are_answered_and_never_counted_lost(
    sentinel_cluster: SentinelCluster, tmp_path: Path, keys: KeySpace, delivery: str
) -> None:
    """Calls in flight at the primary's SIGKILL end right after it, while no primary exists: their
    FINISH keeps trying until the promoted replica takes it, so each is answered once, and no drop is
    counted for them. Before: FINISH gave up after ~1.5 s; in lists mode the calls were lost (and each
    counted twice, reply_undelivered then lost_in_flight), in durable mode counted reply_undelivered."""
    cluster = sentinel_cluster
    backend = GatedBackend()
    async with backend.running():
        stack = dispatcher_stack(tmp_path, cluster, keys, backend.url, delivery)
        client = connect(cluster.url, health_s=2.0)
        try:
            async with Producer(client, keys=keys) as producer:
                await dispatcher_running(client, keys, stack)  # not charged to the warm-up's timeout
                backend.gate.set()
                await producer.submit(keyed("warm-up"), pool_id="default", timeout=30, request_id="warm-up")
                backend.gate.clear()
                acknowledged = acknowledged_pushes(producer)
                rids = [f"f{i}" for i in range(IN_FLIGHT)]
                calls = [
                    asyncio.create_task(
                        producer.submit(keyed(rid), pool_id="default", timeout=20, request_id=rid)
                    )
                    for rid in rids
                ]
                # Running, and acknowledged: a durable push is answered once the replica persisted it.
                await wait_until(
                    lambda: all(rid in backend.calls and rid in acknowledged for rid in rids),
                    timeout=20,
                    what="calls in flight",
                )
                old = cluster.kill_primary()
                backend.gate.set()  # the calls end now; the sentinels need over a second to notice
                # In a thread: this loop runs the backend and the producer, which carry on meanwhile.
                await asyncio.to_thread(cluster.wait_failover, old)
                outcomes = await asyncio.gather(*calls, return_exceptions=True)
                assert [type(o).__name__ for o in outcomes if isinstance(o, BaseException)] == []
                assert producer.stats.duplicate_replies == 0
            made = [backend.calls[rid] for rid in rids]
            # Lists mode runs a call once; a durable one may run again if its lease was reaped meanwhile.
            assert all(n == 1 for n in made) if delivery == LISTS else all(1 <= n <= 2 for n in made)

            async def counters() -> dict[bytes, bytes]:
                return await client.hgetall(keys.counters("g"))  # type: ignore[no-any-return]

            # Published after each FINISH: a reap of one of these leases was counted before it, if at all.
            async def all_completed() -> bool:
                return int((await counters()).get(b"completed", 0)) >= IN_FLIGHT + 1

            await wait_until(all_completed, timeout=20, what="the completions counted")
            counted = await counters()
            assert int(counted.get(b"dropped:reply_undelivered", 0)) == 0
            assert int(counted.get(b"dropped:lost_in_flight", 0)) == 0
            assert stack.procs[0].poll() is None, (tmp_path / "dispatcher.log").read_text()
        finally:
            stack.stop()
            await client.aclose()
