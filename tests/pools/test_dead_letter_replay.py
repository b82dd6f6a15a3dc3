"""End to end: attempts exhausted -> dead letter -> typed error -> an operator's Replay in the admin
runs it again, through a real dispatcher process and the real simulator."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis
from django.test import Client

from pools import selectors, services
from pools.models import Backend, FabricGroup, Pool
from runtime.errors import DeadLettered
from runtime.producer import SyncProducer
from runtime.queue.keys import KeySpace
from runtime.valkey.embedded import free_port
from tests.support.dispatcher_process import start_dispatcher, stop_dispatcher
from tests.support.waiting import port_open, wait_until_sync

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_dead_letter_replayed_from_the_admin_completes(
    superuser_client: Client, sredis: redis.Redis, keys: KeySpace, valkey_url: str
) -> None:
    sim_port = free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--port", str(sim_port)], cwd=ROOT, stdout=subprocess.DEVNULL
    )
    group = FabricGroup.objects.create(
        group_id="dl",
        total_concurrency=4,
        backend=Backend.objects.create(backend_id="dl-sim", base_url=f"http://127.0.0.1:{sim_port}/v1"),
    )
    pool = Pool.objects.create(
        group=group, pool_id="dl-pool", max_concurrent=4, max_attempts=2, retry_backoff_base_s=0.05,
        retry_backoff_cap_s=0.1,
    )  # fmt: skip
    assert services.group_publish(group=group).ok
    dispatcher = start_dispatcher(valkey_url, keys.prefix, "dl", "d1", concurrency=4)
    producer = SyncProducer(valkey_url, keys=keys)
    try:
        wait_until_sync(lambda: port_open(sim_port), timeout=20)
        # The backend fails this request's first two calls: both attempts of the pool, then it is dead.
        call = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "sim": {"status": 503, "fail_times": 2, "key": "replayed"}}  # fmt: skip
        with pytest.raises(DeadLettered):
            producer.submit(call, pool_id="dl-pool", timeout=20)
        [stored] = selectors.pool_dead_letters(pool=pool)
        assert stored.letter is not None and stored.letter.attempts == 2

        page = f"/admin/pools/pool/{pool.pk}/dead-letters/"
        response = superuser_client.post(page, {"action": "replay", "letter": stored.digest}, follow=True)
        assert "Replayed dead letter request" in response.content.decode()
        # The third call succeeds: the replayed request completes. Its producer was already answered
        # (DeadLettered), so it keeps that first reply and counts this one as a duplicate.
        wait_until_sync(lambda: int(sredis.hget(keys.counters("dl"), "completed") or 0) == 1, timeout=20)
        wait_until_sync(lambda: producer.producer.stats.duplicate_replies == 1, timeout=10)
        assert selectors.pool_dead_letters(pool=pool) == []
    finally:
        producer.close()
        stop_dispatcher(dispatcher)
        sim.terminate()
        sim.wait(10)
