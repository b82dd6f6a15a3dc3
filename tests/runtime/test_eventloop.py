"""The event loop our processes run on: uvloop when importable, asyncio's default otherwise."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from runtime import eventloop


def test_run_uses_uvloop_when_installed() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def loop_type() -> type:
        return type(asyncio.get_running_loop())

    assert eventloop.loop_name() == "uvloop"
    assert eventloop.run(loop_type()) is uvloop.Loop


def test_new_event_loop_is_the_preferred_kind() -> None:
    pytest.importorskip("uvloop")
    loop = eventloop.new_event_loop()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()


def test_without_uvloop_everything_runs_on_asyncio() -> None:
    """A process where uvloop cannot be imported (it does not build everywhere) still runs."""
    script = (
        "import sys; sys.modules['uvloop'] = None\n"
        "import asyncio\n"
        "from runtime import eventloop\n"
        "async def kind(): return type(asyncio.get_running_loop()).__module__\n"
        "print(eventloop.loop_name(), eventloop.run(kind()))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["asyncio", "asyncio.unix_events"]
