"""A history ingester in its own process, so a test can really kill it (SIGKILL) mid-pipeline.

Usage: python -m tests.support.ingester_process VALKEY_URL KEY_PREFIX CHDB_URL BATCH_SIZE HOLD_AT
Runs rounds until killed. With HOLD_AT > 0 it stops inside round HOLD_AT, between that batch's INSERT
and its XACK (the next batch already read ahead), sets ``{KEY_PREFIX}held`` in Valkey and waits there to
be killed; with 0 it just runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import redis

from history.client import client_for
from history.ingester import Ingester
from runtime.queue.keys import KeySpace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_ingester(
    valkey_url: str, prefix: str, ch_url: str, batch_size: int, hold_at: int = 0
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.ingester_process", valkey_url, prefix, ch_url,
         str(batch_size), str(hold_at)],
        cwd=ROOT,
        text=True,
    )  # fmt: skip


def held_key(prefix: str) -> str:
    return f"{prefix}held"


def main(url: str, prefix: str, ch_url: str, batch_size: int, hold_at: int) -> None:
    conn = redis.Redis.from_url(url)
    rounds = 0

    def hold(_: int) -> None:
        nonlocal rounds
        rounds += 1
        if rounds == hold_at:
            conn.set(held_key(prefix), 1)
            threading.Event().wait()  # the scenario: stay between INSERT and XACK until killed

    ingester = Ingester(
        conn, client_for(ch_url), keys=KeySpace(prefix), block_ms=50, batch_size=batch_size, after_insert=hold
    )
    ingester.run(threading.Event())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
