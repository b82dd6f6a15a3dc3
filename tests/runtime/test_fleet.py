"""A fleet of dispatcher processes behaves as one: wake-ups reach one dispatcher, work spreads evenly,
claims are rarely lost, and protected slots hold fleet-wide (checked in the claim, not per process)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import replace

import orjson
import pytest

from runtime.policy.reads import PoolRead
from runtime.producer import Producer
from runtime.queue import groups, scripts
from runtime.queue.dispatching import ClaimRequest, QueueOps, lease_member
from runtime.queue.keys import KeySpace
from runtime.queue.leases import LeaseRecord
from runtime.valkey.client import connect
from runtime.wire.contract import ChatCall, Envelope
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher, start_dispatchers, stop
from tests.support.queueing import call, fill, wait_queued


def exit_stats(procs: list[subprocess.Popen]) -> list[dict[str, int]]:
    """Stops the processes and reads the stats line each prints on exit."""
    assert stop(procs) == [0] * len(procs)
    out = []
    for proc in procs:
        assert proc.stdout is not None
        lines = [line for line in proc.stdout.read().splitlines() if line.startswith("stats ")]
        out.append(orjson.loads(lines[-1].split(" ", 1)[1]))
    return out


@pytest.mark.slow
async def test_live_wake_ups_reach_one_dispatcher_and_spread_the_work(aredis, keys, valkey_url) -> None:
    """Producers push one request at a time: each push wakes one idle dispatcher, not all three."""
    config = GroupConfig(
        group_id="herd",
        policy="drr",
        total_concurrency=3,
        version=1,
        pools=(PoolConfig("a", quantum=1, max_concurrent=3), PoolConfig("b", quantum=1, max_concurrent=3)),
    )
    async with SimulatorServer(SimulatorConfig()) as sim:
        await groups.publish(aredis, keys, replace(config, default_endpoint_url=sim.url))
        procs = [start_dispatcher(valkey_url, keys.prefix, "herd", f"d{i}", concurrency=3) for i in range(3)]
        try:
            async with Producer(aredis, keys=keys) as producer:

                async def client(pool_id: str, first: int) -> None:
                    for i in range(first, first + 100):
                        await producer.submit(call(pool_id, i, latency_ms=5), pool_id=pool_id, timeout=60)

                clients = [client("a", 0), client("b", 0), client("a", 100), client("b", 100)]
                await asyncio.wait_for(asyncio.gather(*clients), 90)
        finally:
            stats = exit_stats(procs)
    completed = [s["completed"] for s in stats]
    lost = sum(s["claim_lost"] for s in stats)
    assert sum(completed) == 400 and set(sim.calls_by_user.values()) == {1}
    assert lost / sum(completed) <= 0.1, stats
    assert all(s["wake_tokens"] > 0 for s in stats), stats  # each woke on tokens, not on polls
    assert min(completed) >= 400 / 3 * 0.5, f"uneven split {completed}"


@pytest.mark.slow
async def test_protected_slots_hold_fleet_wide_in_every_sample(aredis, keys, valkey_url) -> None:
    """Three dispatchers; a heavy pool must never take the slots owed to a backlogged protected pool.

    Each 10 ms sample reads the leases and the backlog in one MULTI, so it is an exact instant.
    """
    total, protected = 4, 2
    config = GroupConfig(
        group_id="guard",
        policy="drr",
        total_concurrency=total,
        version=1,
        pools=(
            PoolConfig("bulk", quantum=8, max_concurrent=total),
            PoolConfig("vip", quantum=1, max_concurrent=total, min_concurrent=protected),
        ),
    )
    violations, samples = [], 0
    async with SimulatorServer(SimulatorConfig()) as sim:
        await groups.publish(aredis, keys, replace(config, default_endpoint_url=sim.url))
        async with Producer(aredis, keys=keys) as producer:
            # Short protected calls free their slots often; long bulk calls hold a stolen slot long
            # enough for the 10 ms samples to see it.
            tasks = await fill(producer, "vip", 400, latency_ms=1)
            tasks += await fill(producer, "bulk", 600, latency_ms=20)
            await wait_queued(aredis, keys, "bulk", 600)
            procs = await start_dispatchers(
                valkey_url, keys.prefix, "guard", [f"d{i}" for i in range(3)], concurrency=4
            )
            try:
                while await aredis.llen(keys.requests("vip")) > 0:
                    async with aredis.pipeline(transaction=True) as pipe:
                        pipe.llen(keys.requests("vip"))
                        pipe.zcard(keys.pool_inflight("vip"))
                        pipe.zcard(keys.group_inflight("guard"))
                        backlog, vip, group = await pipe.execute()
                    samples += 1
                    owed = max(0, protected - vip) if backlog else 0
                    if group + owed > total:
                        violations.append((backlog, vip, group))
                    await asyncio.sleep(0.01)  # not a wait: the monitor's sampling interval
                await asyncio.wait_for(asyncio.gather(*tasks), 60)
            finally:
                exit_stats(procs)
    assert samples >= 20
    assert violations == [], f"{len(violations)} of {samples} samples had others in protected slots"
    assert sim.peak_active <= total


async def _queued(aredis, keys, pool_id: str, n: int) -> list[bytes]:
    raws = [
        Envelope(
            request_id=f"{pool_id}-{i}",
            producer_id="p",
            pool_id=pool_id,
            call=ChatCall.from_openai(call(pool_id, i)),
            enqueued_at=time.time(),
        ).encode()
        for i in range(n)
    ]
    await aredis.rpush(keys.requests(pool_id), *raws)
    await aredis.set(keys.producer_alive("p"), b"1", px=60_000)
    return raws


def _launch(pool_id: str, raw: bytes, n: int, **kw: object) -> ClaimRequest:
    return ClaimRequest(
        pool_id=pool_id,
        raw=raw,
        mode="launch",
        lease_member=lease_member(pool_id, f"{pool_id}-{n}"),
        producer_id="p",
        pool_max=4,
        group_limit=4,
        **kw,  # type: ignore[arg-type]
    )


async def test_claim_refuses_a_slot_protected_for_another_backlogged_pool(aredis, keys) -> None:
    """The claim itself checks the fleet-wide counts: a decision from a stale view cannot steal."""
    queue = QueueOps(aredis, keys, "g")
    bulk = await _queued(aredis, keys, "bulk", 4)
    await _queued(aredis, keys, "vip", 2)
    guard = (("vip", 2),)
    claims = [_launch("bulk", raw, i, reserved_for=guard) for i, raw in enumerate(bulk[:3])]
    results = await queue.claim(claims, lease_s=30)
    # Two of four slots stay owed to vip (backlogged, nothing running): bulk gets two, then is refused.
    assert [code for code, _, _ in results] == [scripts.CLAIMED, scripts.CLAIMED, scripts.CLAIM_RESERVED]
    vip_raw = (await aredis.lrange(keys.requests("vip"), 0, 0))[0]
    results = await queue.claim([_launch("vip", vip_raw, 0, protected=2)], lease_s=30)
    assert results[0][0] == scripts.CLAIMED  # inside its own protected slots
    assert await aredis.llen(keys.requests("bulk")) == 2


async def test_claim_batches_run_by_sha_and_survive_a_script_flush(private_valkey) -> None:
    """No SCRIPT EXISTS per claim batch (one round trip); after SCRIPT FLUSH the scripts reload."""
    client = connect(private_valkey.url)
    keys = KeySpace("t:")
    try:
        queue = QueueOps(client, keys, "g")
        raws = await _queued(client, keys, "a", 3)
        assert (await queue.claim([_launch("a", raws[0], 0)], lease_s=30))[0][0] == scripts.CLAIMED
        await client.config_resetstat()
        assert (await queue.claim([_launch("a", raws[1], 1)], lease_s=30))[0][0] == scripts.CLAIMED
        stats = await client.info("commandstats")
        assert not [name for name in stats if name.startswith("cmdstat_script")], stats  # SCRIPT EXISTS|LOAD
        assert stats["cmdstat_evalsha"]["calls"] == 1, stats
        await client.script_flush()
        assert (await queue.claim([_launch("a", raws[2], 2)], lease_s=30))[0][0] == scripts.CLAIMED
        await queue.observe([PoolRead("a", depth=4, pool_max=10)], group_limit=10)
    finally:
        await client.aclose()


async def test_one_claim_checks_protected_slots_and_stores_lease_records_for_the_reaper(aredis, keys) -> None:
    """Both branches' duties in one CLAIM: a claim refused for another pool's protected slots stores no
    lease record; the launched ones store theirs, and once their leases expire the reaper hands them back."""
    queue = QueueOps(aredis, keys, "g")
    bulk = await _queued(aredis, keys, "bulk", 3)
    await _queued(aredis, keys, "vip", 2)
    records = [
        LeaseRecord.of(Envelope.decode(raw), pool_id="bulk", claimed_at=0.0, dispatcher_id="d", cost=1)
        for raw in bulk
    ]
    claims = [
        _launch("bulk", raw, i, reserved_for=(("vip", 2),), lease_record=records[i].encode())
        for i, raw in enumerate(bulk)
    ]
    results = await queue.claim(claims, lease_s=30)
    assert [code for code, _, _ in results] == [scripts.CLAIMED, scripts.CLAIMED, scripts.CLAIM_RESERVED]
    held = {c.lease_member.encode() for c in claims[:2]}
    assert set(await aredis.hkeys(keys.lease_records("g"))) == held
    for member in held:  # the dispatcher died: its leases run out
        await aredis.zadd(keys.group_inflight("g"), {member: 1}, xx=True)
        await aredis.zadd(keys.pool_inflight("bulk"), {member: 1}, xx=True)
    reads = [PoolRead("bulk", depth=4, pool_max=4), PoolRead("vip", depth=4, pool_max=4)]
    for source in (scripts.REAP, scripts.OBSERVE):  # as in a running dispatcher: loaded by earlier rounds
        await aredis.script_load(source)
    seen = await queue.observe(reads, group_limit=4)
    assert sorted(r.request_id for r in seen.lost) == ["bulk-0", "bulk-1"]
    assert await aredis.hlen(keys.lease_records("g")) == 0
    assert (seen.group_in_flight, seen.views["vip"].heads_read) == (0, True)


async def test_a_backend_held_by_a_429_takes_no_claim_whatever_the_dispatchers_reading_said(
    aredis, keys
) -> None:
    """Issue 23: a round may decide from a reading up to STATUS_MAX_AGE_S old, so the claim checks the
    backend's Retry-After hold itself, as it checks the in-flight limit: set by any dispatcher of any
    group, it refuses every claim on that backend until Valkey expires it, and nothing leaves the list."""
    queue = QueueOps(aredis, keys, "g")
    raws = await _queued(aredis, keys, "bulk", 2)
    await aredis.set(keys.backend_hold("gpu"), "30", px=30_000)
    held = [_launch("bulk", raws[0], 0, backend_id="gpu", backend_limit=2)]
    plain = [_launch("bulk", raws[0], 0)]  # a bare endpoint URL: no backend row, no hold of its own
    assert [code for code, _, _ in await queue.claim(held, lease_s=30)] == [scripts.CLAIM_BACKEND_HELD]
    assert await aredis.llen(keys.requests("bulk")) == 2
    assert await aredis.zcard(keys.backend_inflight("gpu")) == 0
    assert [code for code, _, _ in await queue.claim(plain, lease_s=30)] == [scripts.CLAIMED]
    await aredis.delete(keys.backend_hold("gpu"))
    again = [_launch("bulk", raws[1], 1, backend_id="gpu", backend_limit=2)]
    assert [code for code, _, _ in await queue.claim(again, lease_s=30)] == [scripts.CLAIMED]
    assert await aredis.zcard(keys.backend_inflight("gpu")) == 1


async def test_durable_claims_hold_backend_leases_that_finish_fences_and_reap_requeues(aredis, keys) -> None:
    """The durable and backend duties in one set of scripts: a durable claim takes a fencing token
    and a backend lease under the backend's fleet-wide limit; a stale FINISH releases nothing (not the
    backend's lease either), the current one releases both; an expired durable lease goes back to the
    head of its list and gives its backend slot back."""
    queue = QueueOps(aredis, keys, "g")
    raws = await _queued(aredis, keys, "bulk", 3)
    backend = keys.backend_inflight("gpu")
    claims = [
        _launch("bulk", raw, i, requeue=raw, backend_id="gpu", backend_limit=2) for i, raw in enumerate(raws)
    ]
    results = await queue.claim(claims, lease_s=30)
    assert [code for code, _, _ in results] == [scripts.CLAIMED, scripts.CLAIMED, scripts.CLAIM_BACKEND_CAP]
    tokens = [token for _, _, token in results[:2]]
    assert all(tokens) and tokens[0] != tokens[1]
    assert await aredis.zcard(backend) == 2
    assert await aredis.exists(keys.pool_drain("bulk"))  # admission control sees what left the queue

    first = claims[0].lease_member
    finish = {"pool_id": "bulk", "producer_id": "p", "member": first, "reply": b"ok", "reply_ttl_s": 30}
    stale = await queue.finish(**finish, token=str(int(tokens[0]) + 100), backend_id="gpu")  # type: ignore[arg-type]
    assert stale == scripts.FINISH_STALE
    assert await aredis.zcard(backend) == 2
    done = await queue.finish(**finish, token=tokens[0], backend_id="gpu")  # type: ignore[arg-type]
    assert done == scripts.FINISH_DELIVERED
    assert await aredis.zrange(backend, 0, -1) == [claims[1].lease_member.encode()]

    second = claims[1].lease_member.encode()
    for zset in (keys.group_inflight("g"), keys.pool_inflight("bulk"), backend):  # its dispatcher died
        await aredis.zadd(zset, {second: 1}, xx=True)
    for source in (scripts.REAP, scripts.OBSERVE):
        await aredis.script_load(source)
    seen = await queue.observe([PoolRead("bulk", depth=4, pool_max=4)], group_limit=4, backend_ids=["gpu"])
    assert seen.requeued == (raws[1],) and not seen.lost
    assert await aredis.lrange(keys.requests("bulk"), 0, 0) == [raws[1]]
    assert await aredis.zcard(backend) == 0
