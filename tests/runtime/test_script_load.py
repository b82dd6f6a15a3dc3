"""Scripts refused with NOSCRIPT together are loaded once, against a real Valkey with a cold script cache.

The failing condition (bench/pump_stall.py): one producer's first 4,000 submits all met an empty script
cache and each sent its own SCRIPT LOAD through the client's pool; the liveness refresh waited behind
them until the marker expired, and the dispatcher dropped the calls as ``producer_gone``.
"""

from __future__ import annotations

import asyncio

from runtime.valkey.client import connect
from runtime.valkey.lua import LuaScript, _Loads

INCR = LuaScript("return redis.call('INCRBY', KEYS[1], ARGV[1]) -- test_script_load")
BURST = 300


async def _loads(client) -> int:  # type: ignore[no-untyped-def]
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_script|load", {}).get("calls", 0))


async def test_a_burst_refused_together_loads_the_script_once(private_valkey) -> None:
    client = connect(private_valkey.url)
    try:
        script = INCR.bind(client)
        results = await asyncio.gather(*(script(keys=["n"], args=[1]) for _ in range(BURST)))
        assert sorted(results) == list(range(1, BURST + 1))  # every refused call ran exactly once more
        assert await _loads(client) == 1
        # A refusal after that load finished (the cache flushed again) loads again, once per burst.
        await client.script_flush()
        await asyncio.gather(*(script(keys=["n"], args=[1]) for _ in range(BURST)))
        assert await _loads(client) == 2
        assert int(await client.get("n")) == 2 * BURST
    finally:
        await client.aclose()


async def test_a_refusal_read_after_the_load_finished_sends_again_without_loading(private_valkey) -> None:
    """CI's failure: the refused EVALSHAs came back on the pipelined connection and the SCRIPT LOAD on a
    pooled one, and the loop read a refusal after the load had finished. That refusal was of a command
    sent before the load finished, so the script is there: send again, do not load again."""
    client = connect(private_valkey.url)
    try:
        loads = _Loads()
        sent_before = loads.finished
        await loads.ensure(client, INCR, sent_before)
        assert await _loads(client) == 1
        await loads.ensure(client, INCR, sent_before)  # the late refusal
        assert await _loads(client) == 1
        assert await client.script_exists(INCR.sha) == [True]
        # A command sent after that load and still refused met a flush: it loads again.
        await client.script_flush()
        await loads.ensure(client, INCR, loads.finished)
        assert await _loads(client) == 2
        assert await client.script_exists(INCR.sha) == [True]
    finally:
        await client.aclose()
