"""Helpers to run a real dispatcher, simulator and producers inside one test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import redis.asyncio as aioredis

from runtime.config import DispatcherSettings
from runtime.dispatch.dispatcher import Dispatcher
from runtime.errors import BackendHTTPError
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.keys import KeySpace
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.waiting import wait_until

__all__ = [
    "CALL",
    "NO_POLL",
    "fail_calls",
    "one_pool_group",
    "one_pool_stack",
    "running_dispatcher",
    "slow_call",
    "submit_one_at_a_time",
    "wait_until",
]

CALL = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
# Dispatcher settings with an idle poll of a minute: a request left without a wake-up would visibly
# stall its test instead of being picked up by the poll.
NO_POLL = {"idle_poll_s": 60.0}


def one_pool_group(
    endpoint: str,
    *,
    group_id: str = "g",
    pool_id: str = "default",
    policy: str = "fifo",
    total: int = 16,
    max_concurrent: int = 16,
) -> GroupConfig:
    return GroupConfig(
        group_id=group_id,
        policy=policy,
        total_concurrency=total,
        default_endpoint_url=endpoint,
        pools=(PoolConfig(pool_id=pool_id, max_concurrent=max_concurrent),),
        version=1,
    )


def slow_call(latency_ms: float, **sim: Any) -> dict[str, Any]:
    return {**CALL, "sim": {"latency_ms": latency_ms, **sim}}


async def fail_calls(producer: Producer, count: int, *, pool_id: str = "default", status: int = 503) -> None:
    """Submits ``count`` calls the simulator fails with ``status`` (e.g. to open a breaker)."""
    for _ in range(count):
        with pytest.raises(BackendHTTPError):
            await producer.submit({**CALL, "sim": {"status": status}}, pool_id=pool_id, timeout=10)


@contextlib.asynccontextmanager
async def running_dispatcher(
    client: aioredis.Redis,
    keys: KeySpace,
    config: GroupConfig,
    *,
    tracer: Any = None,
    snapshot_sink: Any = None,
    store_content: bool = False,
    secrets: Mapping[str, str] | None = None,
    **overrides: Any,
) -> AsyncIterator[Dispatcher]:
    """Publishes ``config`` and runs a dispatcher in this event loop; ``overrides`` are its settings."""
    await groups.publish(client, keys, config)
    settings = DispatcherSettings(group_id=config.group_id, **{"shutdown_grace_s": 10.0, **overrides})
    dispatcher = Dispatcher(
        client, settings, keys=keys, tracer=tracer, snapshot_sink=snapshot_sink, store_content=store_content,
        secrets=secrets,
    )  # fmt: skip
    task = asyncio.create_task(dispatcher.run(install_signal_handlers=False))
    await wait_until(lambda: dispatcher.config is not None or task.done())
    if task.done():
        task.result()
    try:
        yield dispatcher
    finally:
        dispatcher.request_stop()
        await asyncio.wait_for(task, 30)


@contextlib.asynccontextmanager
async def one_pool_stack(
    client: aioredis.Redis, keys: KeySpace, **overrides: Any
) -> AsyncIterator[tuple[Dispatcher, Producer]]:
    """A simulator, a dispatcher of its one-pool group (``overrides`` are its settings) and a producer."""
    async with (
        SimulatorServer(SimulatorConfig()) as sim,
        running_dispatcher(client, keys, one_pool_group(sim.url), **overrides) as dispatcher,
        Producer(client, keys=keys) as producer,
    ):
        yield dispatcher, producer


async def submit_one_at_a_time(producer: Producer, count: int, *, timeout: float = 10) -> None:
    """``count`` calls to the pool ``default``, each sent once the one before it is answered."""
    for _ in range(count):
        await producer.submit(CALL, pool_id="default", timeout=timeout)
