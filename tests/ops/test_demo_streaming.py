"""The demo's backend streams like a served model: a person trying ``stream=True`` against the demo sees
the answer arrive token by token, not in one burst after a pause."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from ops.management.commands.demo import DEMO_SIMULATOR_OPTIONS
from runtime.valkey.embedded import free_port
from tests.support.waiting import wait_for_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo_simulator() -> Iterator[str]:
    """The simulator as ``manage.py demo`` runs it, as its own process; yields its OpenAI base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--port", str(port), *DEMO_SIMULATOR_OPTIONS],
        cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_demo_simulator_streams_token_by_token(demo_simulator: str) -> None:
    client = openai.OpenAI(base_url=demo_simulator, api_key="demo")
    arrivals: list[float] = []
    with client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "Hello"}], stream=True
    ) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic())
    client.close()
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert len(arrivals) == 16  # the demo's answer length
    # 15 intervals of 30 ms: the last token comes about 0.45 s after the first. A busy machine may
    # delay a token and bunch a few, but never brings one before its time.
    assert arrivals[-1] - arrivals[0] >= 0.3, gaps
    assert sum(gap >= 0.015 for gap in gaps) >= 10, gaps  # one by one, not in a burst
