"""The dashboard's tenants of a fair pool (issue 22), read from keys the real queue scripts wrote: the
fair push (``ProducerOps.push``) and the fair claim (``QueueOps.claim`` with a planned pick)."""

from __future__ import annotations

import time

import pytest
import redis
import redis.asyncio as aioredis

from dashboard import selectors
from dashboard.merge import counter_totals, finish_view, merge_snapshots
from dashboard.tenant_window import ServedWindow
from runtime.policy.admission import AdmissionLimits
from runtime.queue.dispatching import ClaimRequest, QueueOps, lease_member
from runtime.queue.keys import KeySpace
from runtime.queue.leases import LeaseRecord
from runtime.queue.producing import ProducerOps
from runtime.queue.tenant_dispatch import FairPick
from runtime.queue.tenants import TenantPush
from runtime.wire.contract import ChatCall, Envelope

POOL = "chat"
OPEN = AdmissionLimits()


def envelope(request_id: str, tenant: str | None) -> Envelope:
    call = ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    return Envelope(request_id, "p1", POOL, call, time.time(), tenant=tenant)


async def push(ops: ProducerOps, tenant: str | None, n: int, prefix: str) -> list[Envelope]:
    sent = [envelope(f"{prefix}{i}", tenant) for i in range(n)]
    for env in sent:
        await ops.push(POOL, env.encode(), OPEN, tenant=TenantPush(tenant))
    return sent


async def claim(queue: QueueOps, env: Envelope, charge: float) -> None:
    """The dispatcher's claim of a fair pool's head: lease, lease record, counter and served charge."""
    raw = env.encode()
    queue.fair_picks.setdefault(POOL, {})[raw] = FairPick(str(env.tenant), charge)
    record = LeaseRecord.of(env, pool_id=POOL, claimed_at=time.time(), dispatcher_id="d1", cost=1).encode()
    request = ClaimRequest(
        POOL, raw, "launch", lease_member=lease_member(POOL, env.request_id), producer_id="p1",
        pool_max=8, group_limit=8, lease_record=record,
    )  # fmt: skip
    [(code, _, _)] = await queue.claim([request], 30.0)
    assert code in (b"claimed", "claimed"), code


async def finish(queue: QueueOps, env: Envelope, served: float) -> None:
    """The call's FINISH: what it was served counts for its tenant once it is done."""
    member = lease_member(POOL, env.request_id)
    queue.stage_correction(member, 0.0, served)
    await queue.finish(pool_id=POOL, producer_id="p1", member=member, reply=b"", reply_ttl_s=10.0)


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch) -> ServedWindow:
    fresh = ServedWindow()
    monkeypatch.setattr(selectors, "SERVED_WINDOW", fresh)
    return fresh


async def test_a_noisy_tenant_tops_its_fair_pool(
    aredis: aioredis.Redis, sredis: redis.Redis, keys: KeySpace, window: ServedWindow
) -> None:
    ops, queue = ProducerOps(aredis, keys), QueueOps(aredis, keys, "g")
    await aredis.set(keys.producer_alive("p1"), b"1", ex=60)  # the claim drops a gone producer's work
    queue.fair_pools = frozenset({POOL})
    noisy = await push(ops, "key-noisy", 6, "n")
    await push(ops, "key-quiet", 1, "q")
    await push(ops, None, 2, "u")
    await claim(queue, noisy[0], 4.0)
    await finish(queue, noisy[0], 4.0)
    await claim(queue, noisy[1], 4.0)
    now = time.time()

    read = selectors.tenants_read(group_id="g", fairness={POOL: "tokens"}, now=now, client=sredis)
    assert set(read) == {POOL} and read[POOL]["backlogged"] == 3 and read[POOL]["fairness"] == "tokens"
    assert [(r["tenant"], r["queued"], r["in_flight"]) for r in read[POOL]["rows"]] == [
        ("key-noisy", 4, 1), ("*", 2, 0), ("key-quiet", 1, 0),
    ]  # fmt: skip
    top = read[POOL]["rows"][0]
    assert (top["counter"], top["served"], top["served_last_minute"]) == (8.0, 4.0, None)  # no earlier read

    await finish(queue, noisy[1], 4.0)
    await claim(queue, noisy[2], 4.0)
    later = selectors.tenants_read(group_id="g", fairness={POOL: "tokens"}, now=now + 60, client=sredis)
    by_tenant = {r["tenant"]: r for r in later[POOL]["rows"]}
    assert by_tenant["key-noisy"]["in_flight"] == 1 and by_tenant["key-noisy"]["served"] == 8.0
    assert by_tenant["key-noisy"]["served_last_minute"] == 4.0  # served since the read 60 s before
    assert by_tenant["key-quiet"]["served_last_minute"] == 0.0


async def test_only_the_top_tenants_of_a_crowded_pool_are_listed(
    aredis: aioredis.Redis, sredis: redis.Redis, keys: KeySpace, window: ServedWindow
) -> None:
    ops = ProducerOps(aredis, keys)
    for i in range(1, 13):
        await push(ops, f"key-{i}", i, f"k{i}-")
    read = selectors.tenants_read(group_id="g", fairness={POOL: "requests"}, now=time.time(), client=sredis)
    assert read[POOL]["backlogged"] == 12
    assert [r["queued"] for r in read[POOL]["rows"]] == list(range(12, 2, -1))
    assert selectors.tenants_read(group_id="g", fairness={}, now=time.time(), client=sredis) == {}


def test_the_view_carries_the_fair_pools_tenants_once() -> None:
    configured = [
        {"pool_id": p, "display_name": p, "weight": 1, "min_concurrent": 0, "max_concurrent": 1,
         "max_burst_per_visit": 1, "enabled": True, "paused": False, "max_queued": None,
         "tenant_fairness": mode, "admin_url": "", "dead_letters_url": ""}
        for p, mode in (("fair", "requests"), ("plain", "off"))
    ]  # fmt: skip
    assert selectors.fair_pools(configured) == {"fair": "requests"}  # type: ignore[arg-type]
    board = {"pool_id": "fair", "fairness": "requests", "backlogged": 0, "rows": []}
    totals = {**counter_totals({}), "tenants": {"fair": board}}
    view = finish_view(
        merge_snapshots([], now=1.0), group_id="g", configured=configured, queue_lengths={},  # type: ignore[arg-type]
        totals=totals, now=1.0,
    )  # fmt: skip
    assert view["tenant_pools"] == [board]
    assert "tenants" not in view["totals"] and "tenants" in totals  # the caller's totals are reused


@pytest.mark.parametrize(
    ("reads", "expected"),
    [
        ([(0.0, {"a": 1.0})], {"a": None}),  # nothing earlier
        ([(0.0, {"a": 1.0}), (0.5, {"a": 2.0})], {"a": None}),  # too soon to say
        ([(0.0, {"a": 1.0}), (30.0, {"a": 4.0})], {"a": 6.0}),  # half a minute so far: scaled
        ([(0.0, {"a": 1.0}), (60.0, {"a": 4.0, "b": 9.0})], {"a": 3.0, "b": None}),  # b: not read before
        ([(0.0, {"a": 1.0}), (60.0, {"a": 0.5})], {"a": 0.0}),  # a usage correction below the estimate
        # every 10 s: the newest sample at least 60 s old is the baseline (t = 20 for t = 85)
        ([(10.0 * i, {"a": 10.0 * i}) for i in range(9)] + [(85.0, {"a": 85.0})],
         {"a": 60.0}),
    ],
)  # fmt: skip
def test_the_served_window(reads: list[tuple[float, dict[str, float]]], expected: dict[str, float]) -> None:
    window = ServedWindow()
    for now, served in reads:
        result = window.per_minute(POOL, now, served)
    assert result == pytest.approx(expected)
