"""A benchmark's child processes do not outlive it, even when it is killed outright (SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]

# A stand-in bench: spawns a long-sleeping child the way every benchmark does, prints its pid, waits.
BENCH = """
import sys, time
from bench._common import spawn
child = spawn(["-c", "import time; print('ready', flush=True); time.sleep(120)"])
assert child.stdout is not None and child.stdout.readline().strip() == "ready"
print(child.pid, flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for init here, which may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_benchs_children_are_stopped() -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child = 0
    try:
        assert bench.stdout is not None
        child = int(bench.stdout.readline())
        assert _running(child)
        os.kill(bench.pid, signal.SIGKILL)
        bench.wait(10)
        wait_until_sync(lambda: not _running(child), timeout=10, what="the killed bench's child to stop")
    finally:
        if bench.poll() is None:
            bench.kill()
        if child and _running(child):  # failed: leave no sleeper behind
            os.kill(child, signal.SIGKILL)
