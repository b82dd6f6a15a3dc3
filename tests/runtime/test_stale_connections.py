"""The runtime's redis-py client after a Valkey restart: a pooled connection left over from the old
server fails its next command once; that command goes again on a fresh connection instead of failing
its caller (it made a producer started right after a restart fail, now and then, on a busy machine)."""

from __future__ import annotations

import asyncio

from runtime.valkey import embedded
from runtime.valkey.client import connect


async def test_the_first_commands_after_a_valkey_restart_succeed(private_valkey) -> None:
    client = connect(private_valkey.url)
    try:
        for restart in range(3):
            # Several connections in the pool, each idle and each about to go stale.
            await asyncio.gather(*(client.set(f"k{i}", restart) for i in range(4)))
            embedded.stop(private_valkey.data_dir)
            embedded.start(private_valkey.data_dir, port=private_valkey.port)
            assert await client.set("after", restart)
            values = await asyncio.gather(*(client.get(f"k{i}") for i in range(4)))
            assert values == [str(restart).encode()] * 4
    finally:
        await client.aclose()
