"""Valkey loses the published configuration (FLUSHALL on a real server): a real ``rundispatcher``
republishes it from the database within seconds, a producer keeps enforcing the pools' limits during
the gap, and the dashboard says when the configuration was restored."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
import redis
from asgiref.sync import sync_to_async
from django.test import Client

from pools import connections
from runtime.config import ProducerSettings
from runtime.errors import QueueFull, UnknownPool
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from runtime.valkey.client import connect
from tests.support.dashboard_live import point_dashboard_at
from tests.support.installation import MANAGE, Running, installation_env, manage, sql
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CALL = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
REFRESH_S = 0.05  # the producer reads the registry this often (the default is 2 s)


@pytest.mark.timeout(240)
async def test_a_flushed_valkey_gets_the_configuration_back_and_limits_hold_meanwhile(
    tmp_path: Path, private_valkey, keys: KeySpace, settings, fabric, staff
) -> None:
    data_dir = tmp_path / "var"
    env = installation_env(data_dir, VALKEY_URL=private_valkey.url, DISPATCH_KEY_PREFIX=keys.prefix)
    await asyncio.to_thread(manage, env, "migrate", "--verbosity", "0")
    await asyncio.to_thread(manage, env, "seed_demo", "--endpoint", "http://127.0.0.1:9/v1")
    # A paused pool keeps its requests queued: the queue depth stays what the producers made it.
    sql(data_dir, "UPDATE pools_pool SET paused = 1, max_queued = 1 WHERE pool_id = 'interactive'")
    dispatcher = Running([*MANAGE, "rundispatcher", "--group", "demo", "--dispatcher-id", "d-r"], env)
    client = connect(private_valkey.url)
    admin = redis.Redis.from_url(private_valkey.url)
    waiting: list[asyncio.Task] = []
    try:
        await asyncio.to_thread(dispatcher.wait_for, "serving fabric group demo", 90)
        producer_settings = ProducerSettings(pool_registry_refresh_s=REFRESH_S)
        async with Producer(client, keys=keys, settings=producer_settings) as producer:
            waiting.append(asyncio.create_task(producer.submit(CALL, pool_id="interactive", timeout=120)))
            await wait_until(lambda: admin.llen(keys.requests("interactive")) == 1, what="first queued")
            assert producer.configuration == "published"

            # The gap held open: the dispatcher that would republish is frozen while Valkey forgets.
            os.kill(dispatcher.proc.pid, signal.SIGSTOP)
            admin.flushall()
            await asyncio.sleep(REFRESH_S * 2)  # the scenario: the producer's copy goes stale
            waiting.append(asyncio.create_task(producer.submit(CALL, pool_id="interactive", timeout=120)))
            await wait_until(lambda: admin.llen(keys.requests("interactive")) == 1, what="queued in the gap")
            with pytest.raises(QueueFull):
                await producer.submit(CALL, pool_id="interactive", timeout=120)
            with pytest.raises(UnknownPool):
                await producer.submit(CALL, pool_id="nowhere", timeout=120)
            assert producer.configuration == "last_known"
            assert not admin.exists(keys.pool_registry())

            resumed = time.monotonic()
            os.kill(dispatcher.proc.pid, signal.SIGCONT)
            await wait_until(
                lambda: admin.exists(keys.pool_registry(), keys.group_config("demo")) == 2,
                timeout=5,
                what="the configuration republished",
            )
            assert time.monotonic() - resumed < 5
            # The scenario: time passes until the producer's copy is stale again, so it reads Valkey.
            await asyncio.sleep(REFRESH_S * 2)
            with pytest.raises(QueueFull):  # the republished limits, read from Valkey again
                await producer.submit(CALL, pool_id="interactive", timeout=120)
            assert producer.configuration == "published"
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
    finally:
        os.kill(dispatcher.proc.pid, signal.SIGCONT)
        code = await asyncio.to_thread(dispatcher.stop, signal.SIGTERM)
        await client.aclose()
        admin.close()
    assert code == 0, dispatcher.output()
    assert dispatcher.saw("Valkey had lost the published configuration: dispatcher d-r republished")

    point_dashboard_at(settings, private_valkey.url, keys)
    try:
        html = await sync_to_async(dashboard_page)(staff)
    finally:
        connections.valkey_url.cache_clear()
    assert "Configuration restored at" in html and "by dispatcher d-r" in html


def dashboard_page(staff) -> str:
    page = Client()
    page.force_login(staff)
    return page.get("/fabric/g/").content.decode()
