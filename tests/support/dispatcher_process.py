"""A dispatcher in its own process, so tests can race several of them and really kill one.

Usage: python -m tests.support.dispatcher_process URL PREFIX GROUP_ID DISPATCHER_ID CONCURRENCY LEASE_S
Prints "ready" once it has loaded the group's configuration, and on exit one line
``stats {"completed": ..., "claim_lost": ..., "wake_tokens": ...}`` for fleet tests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

import orjson

from runtime.config import DispatcherSettings
from runtime.dispatch.dispatcher import Dispatcher
from runtime.queue.keys import KeySpace
from runtime.valkey.client import connect
from tests.support.waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_dispatcher(
    valkey_url: str, prefix: str, group_id: str, ident: str, concurrency: int = 8, lease_s: float = 15.0
) -> subprocess.Popen[str]:
    """Starts a dispatcher process and returns once it has loaded its configuration."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.dispatcher_process",
            valkey_url,
            prefix,
            group_id,
            ident,
            str(concurrency),
            str(lease_s),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


async def start_dispatchers(
    valkey_url: str,
    prefix: str,
    group_id: str,
    idents: Sequence[str],
    concurrency: int = 8,
    lease_s: float = 15.0,
) -> list[subprocess.Popen[str]]:
    """Starts dispatcher processes side by side, off the event loop; returns once each is ready.

    Off the loop because a test's :class:`Producer` shares it: while the loop sat in ``readline`` for
    start-ups (three in a row at load 15-18 can pass the liveness marker's 12 s TTL), the producer could
    not refresh its marker, and the dispatchers already running dropped its calls as producer_gone.
    """
    started = await asyncio.gather(
        *(
            asyncio.to_thread(start_dispatcher, valkey_url, prefix, group_id, ident, concurrency, lease_s)
            for ident in idents
        ),
        return_exceptions=True,
    )
    procs = [s for s in started if isinstance(s, subprocess.Popen)]
    failed = [s for s in started if not isinstance(s, subprocess.Popen)]
    if failed:
        for proc in procs:
            stop_dispatcher(proc)
        raise failed[0]
    return procs


def stop_dispatcher(proc: subprocess.Popen[str], timeout: float = 20.0) -> None:
    """SIGTERM (a graceful stop) and wait; SIGKILL if it does not end in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


async def main(
    url: str, prefix: str, group_id: str, dispatcher_id: str, concurrency: int, lease_s: float
) -> None:
    client = connect(url)
    settings = DispatcherSettings(
        group_id=group_id,
        dispatcher_id=dispatcher_id,
        concurrency=concurrency,
        lease_s=lease_s,
        shutdown_grace_s=10,
    )
    dispatcher = Dispatcher(client, settings, keys=KeySpace(prefix))
    task = asyncio.create_task(dispatcher.run())
    await wait_until(lambda: dispatcher.config is not None or task.done(), timeout=60, what="a configuration")
    print("ready", flush=True)
    await task
    await client.aclose()
    stats = {
        "completed": dispatcher.stats.completed,
        "claim_lost": dispatcher.stats.claim_lost,
        "wake_tokens": dispatcher.waiter.tokens,
        "turn_busy": dispatcher.stats.turn_busy,
        "dropped": dict(dispatcher.stats.dropped),
    }
    print("stats", orjson.dumps(stats).decode(), flush=True)


if __name__ == "__main__":
    url, prefix, group, ident, concurrency, lease = sys.argv[1:7]
    asyncio.run(main(url, prefix, group, ident, int(concurrency), float(lease)))


def stop(procs: list[subprocess.Popen]) -> list[int]:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return [proc.wait(20) for proc in procs]
