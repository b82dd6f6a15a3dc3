"""A backend that fails twice with 503 and then answers: one reply, three attempt spans in ClickHouse."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider

from history import queries
from history.client import HistoryClient
from history.ingester import Ingester
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import running_dispatcher
from tests.support.history_spans import drain


async def test_two_503s_then_success_leave_three_attempts_in_order(
    aredis: aioredis.Redis,
    sredis: redis.Redis,
    keys: KeySpace,
    history: HistoryClient,
    provider: TracerProvider,
) -> None:
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = GroupConfig(
            group_id="g-retry",
            policy="fifo",
            default_endpoint_url=sim.url,
            pools=(PoolConfig("p", max_attempts=3, retry_backoff_base_s=0.05, retry_backoff_cap_s=0.1),),
            version=1,
        )
        tracer = provider.get_tracer("llm_dispatch.dispatcher")
        async with (
            running_dispatcher(aredis, keys, config, tracer=tracer),
            Producer(aredis, keys=keys) as producer,
        ):
            call = {"model": "m", "messages": [{"role": "user", "content": "x"}],
                    "sim": {"status": 503, "fail_times": 2, "key": "k", "message": "overloaded"}}  # fmt: skip
            result = await producer.submit(call, pool_id="p", timeout=20)
    provider.force_flush()
    assert result.completion["choices"]
    assert drain(Ingester(sredis, history, keys=keys, block_ms=50)) == 3

    detail = queries.execution_detail(client=history, request_id=result.request_id)
    assert detail is not None
    chain = [(a["attempt"], a["status"], a["error_type"]) for a in detail["attempts"]]
    assert chain == [(1, "retry", "backend_http_error"), (2, "retry", "backend_http_error"), (3, "ok", "")]
    assert "overloaded" in detail["attempts"][0]["error_message"]
    assert all(a["wait_s"] is not None and a["wait_s"] >= 0 for a in detail["attempts"])
    assert detail["execution"]["status"] == "ok"
