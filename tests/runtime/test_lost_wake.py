"""A push's wake token that reaches an idle dispatcher just as its idle poll falls due still wakes it.

Both land in the same turn of the dispatcher's event loop when the loop wakes late (a busy machine):
the waiter hands over the token and the idle wait's timeout cancels the wait. The token's wake-up must
not be dropped with the timeout: the request would then wait for the next idle poll (50 ms by
default, and in a fleet longer when another dispatcher's poll marker is still set). Seen in
``bench_ingress.py`` as streams whose first chunk came 52 ms late, one in eight after a burst.

The race is made real here: the dispatcher's loop is the test's own, and the test blocks it (as a
busy machine would) while another thread pushes a call and the idle wait's time runs out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

from runtime.producer import Producer
from runtime.valkey.client import connect
from tests.support.dispatching import CALL, one_pool_group, running_dispatcher, wait_until
from tests.support.loop_thread import loop_thread, simulator_thread

IDLE_POLL_S = 0.2
# The fleet's idle-poll marker is held this long, so only the token can bring the round in time.
POLL_HELD_MS = 60_000
ATTEMPTS = 5


async def test_a_token_that_lands_as_the_idle_wait_times_out_still_brings_its_round(
    aredis, sredis, keys, valkey_url
) -> None:
    with simulator_thread() as sim, loop_thread() as other:
        config = one_pool_group(sim.url)
        async with running_dispatcher(aredis, keys, config, idle_poll_s=IDLE_POLL_S) as dispatcher:
            producer = Producer(connect(valkey_url), keys=keys)

            def on_other_loop(coroutine: Coroutine[Any, Any, Any]) -> Future[Any]:
                return asyncio.run_coroutine_threadsafe(coroutine, other.loop)

            await asyncio.wrap_future(on_other_loop(producer.start()))
            try:
                # Everything connected and warm (awaited: the dispatcher runs on this loop).
                await asyncio.wrap_future(on_other_loop(producer.submit(CALL, pool_id="default", timeout=10)))

                def push_while_the_loop_is_blocked() -> tuple[Future[Any], bool]:
                    """Runs on the dispatcher's loop and blocks it: the call is pushed from the other
                    thread, its token taken by the waiter's pending BLPOP, and the idle wait's time
                    runs out. The call, and whether its token was taken (the scenario happened)."""
                    sredis.set(keys.group_poll(config.group_id), b"1", px=POLL_HELD_MS)
                    call = on_other_loop(producer.submit(CALL, pool_id="default", timeout=30))
                    deadline = time.monotonic() + 5
                    while not sredis.llen(keys.requests("default")) and time.monotonic() < deadline:
                        time.sleep(0.001)
                    time.sleep(IDLE_POLL_S)  # the scenario: the loop is held past the idle wait's end
                    return call, not sredis.llen(keys.wake_list("default"))

                for _ in range(ATTEMPTS):
                    sredis.delete(keys.group_poll(config.group_id))
                    await wait_until(lambda: dispatcher._waiting, what="the dispatcher waiting for work")
                    await asyncio.sleep(0.02)  # the waiter's BLPOP goes out once the wait has begun
                    if not dispatcher._waiting:
                        continue
                    call, token_taken = push_while_the_loop_is_blocked()
                    # The poll marker holds for a minute: without the token's round this call waits for it.
                    await asyncio.wait_for(asyncio.wrap_future(call), 10)
                    if token_taken:
                        break
                else:
                    raise AssertionError(f"the waiter never had a BLPOP pending in {ATTEMPTS} attempts")
            finally:
                await asyncio.wrap_future(on_other_loop(producer.close()))
