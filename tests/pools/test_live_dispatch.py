"""An admin edit reaches a running dispatcher process and changes its live dispatch ratio."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import orjson
import pytest
import redis
from django.test import Client

from pools import services
from pools.models import Backend, FabricGroup, Pool
from runtime.producer import SyncProducer
from runtime.queue.keys import KeySpace
from runtime.valkey.embedded import free_port
from tests.support.pools_admin import changelist_form
from tests.support.waiting import wait_until_sync

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.django_db(transaction=True)  # publication happens at commit


def launched(sredis: redis.Redis, keys: KeySpace) -> tuple[int, dict[str, int]]:
    """(config version, launches per pool) from the dispatcher's live snapshot in Valkey."""
    raw = sredis.get(keys.snapshot("live", "d1"))
    if not raw:
        return 0, {}
    snap = orjson.loads(raw)
    return snap["config_version"], {p["pool_id"]: p["launched"] for p in snap["pools"]}


@pytest.mark.slow
def test_weight_edited_in_the_admin_changes_the_live_ratio(
    superuser_client: Client, sredis: redis.Redis, keys: KeySpace, valkey_url: str
) -> None:
    sim_port = free_port()
    # 20 ms a call bounds the dispatch rate (4 slots: at most 200 launches/s), so the 700 requests a pool
    # holds outlast the edit's 2.25 s at 1:1 plus the 250 launches measured after it. At 2 ms a slow
    # edit on a busy machine let interactive run dry inside the window, and backfill's launches then
    # pulled the ratio down (2.67 in one CI run): the test measured its own backlog, not DRR.
    sim = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--port", str(sim_port), "--latency-ms", "20"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    group = FabricGroup.objects.create(
        group_id="live",
        name="Live",
        policy="drr",
        total_concurrency=4,
        backend=Backend.objects.create(backend_id="live-sim", base_url=f"http://127.0.0.1:{sim_port}/v1"),
    )
    Pool.objects.create(group=group, pool_id="interactive", quantum=1, max_concurrent=4)
    Pool.objects.create(group=group, pool_id="backfill", quantum=1, max_concurrent=4, sort_order=1)
    assert services.group_publish(group=group).ok
    producer = SyncProducer(valkey_url, keys=keys)
    dispatcher = None
    try:
        calls = [
            asyncio.run_coroutine_threadsafe(
                producer.producer.submit(
                    {"model": "m", "messages": [{"role": "user", "content": str(i)}]},
                    pool_id=pool,
                    timeout=120,
                ),
                producer.loop,
            )
            for i in range(700)
            for pool in ("interactive", "backfill")
        ]
        wait_until_sync(
            lambda: sredis.llen(keys.requests("backfill")) == 700, 30, what="700 queued backfill calls"
        )
        dispatcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.dispatcher_process",
                valkey_url,
                keys.prefix,
                "live",
                "d1",
                "4",
                "15",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        wait_until_sync(lambda: sum(launched(sredis, keys)[1].values()) >= 150, 30, what="150 launches")
        version, before = launched(sredis, keys)
        pools = list(Pool.objects.filter(group=group).order_by("sort_order"))
        edited_at = time.monotonic()
        response = superuser_client.post(
            "/admin/pools/pool/", changelist_form(pools, interactive={"quantum": 4})
        )
        assert response.status_code == 302
        wait_until_sync(lambda: launched(sredis, keys)[0] > version, 5, what="the edited configuration live")
        assert time.monotonic() - edited_at < 2.0 + 0.25  # within 2 s, plus one snapshot interval
        _, start = launched(sredis, keys)
        _, end = wait_until_sync(
            lambda: (lambda v: v if sum(v[1].values()) - sum(start.values()) >= 250 else None)(
                launched(sredis, keys)
            ),
            30,
            what="250 launches after the edit",
        )
        for call in calls:
            call.result(60)
    finally:
        if dispatcher is not None:
            dispatcher.send_signal(signal.SIGTERM)
            dispatcher.wait(20)
        producer.close()
        sim.terminate()
        sim.wait(10)
    even = before["interactive"] / before["backfill"]
    after = (end["interactive"] - start["interactive"]) / (end["backfill"] - start["backfill"])
    assert 0.7 <= even <= 1.4
    assert end["interactive"] < 700, "interactive ran dry inside the window: the ratio says nothing"
    assert 3.2 <= after <= 5.0, f"ratio after the edit was {after:.2f}"
