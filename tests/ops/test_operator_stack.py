"""The operator's path with real processes: the demo as the README tells it, and rundispatcher's identity
and queueing-switch lines. Each test owns a throwaway installation (data dir, SQLite, embedded Valkey)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from history import queries
from history.client import HistoryClient
from history.ingester import Ingester
from runtime import gc_tuning
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.keys import KeySpace
from runtime.valkey import embedded
from runtime.valkey.locate import installation_url
from runtime.wire.groupconfig import GroupConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatching import CALL
from tests.support.history_spans import drain
from tests.support.installation import MANAGE, ROOT, Running, installation_env, manage, sql

pytestmark = pytest.mark.slow


def readme_producer_snippet() -> str:
    """The README's producer example, exactly as a reader would copy it."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Using the producer client", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "the README's producer section has no python block"
    return blocks[0]


def snippet_installation(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """A fresh installation's data dir and environment, and the README's producer example beside it."""
    snippet = tmp_path / "hello.py"
    snippet.write_text(readme_producer_snippet())
    return tmp_path / "var", installation_env(tmp_path / "var"), snippet


def run_snippet(snippet: Path, env: dict[str, str]) -> None:
    """Runs the README's producer example as a reader would; it must print a completion."""
    run = subprocess.run([sys.executable, str(snippet)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "queue_wait" in run.stdout and run.stdout.strip(), run.stdout


def start_demo(env: dict[str, str], *extra: str) -> Running:
    ports = [str(embedded.free_port()) for _ in range(2)]
    demo = Running([*MANAGE, "demo", "--no-load", "--port", ports[0], "--sim-port", ports[1], *extra], env)
    demo.wait_for("LLM Dispatch demo is up", 180)
    return demo


def published_backfill_weight(env: dict[str, str]) -> int:
    """The backfill weight running dispatchers of the demo got, read where the snippet finds Valkey."""
    client = redis.Redis.from_url(installation_url(env))
    try:
        raw = client.get(KeySpace().group_config("demo"))
    finally:
        client.close()
    assert raw, "the demo group is not published"
    backfill = GroupConfig.decode(raw).pool("backfill")
    assert backfill is not None
    return backfill.quantum


@pytest.mark.timeout(600)
def test_demo_serves_the_readme_snippet_and_keeps_admin_edits_until_reset(tmp_path: Path) -> None:
    data_dir, env, snippet = snippet_installation(tmp_path)

    demo = start_demo(env)
    try:
        run_snippet(snippet, env)
        sql(data_dir, "UPDATE pools_pool SET quantum = 7 WHERE pool_id = 'backfill'")  # an admin edit
    finally:
        assert demo.stop() == 0, demo.output()

    demo = start_demo(env)
    try:
        assert sql(data_dir, "SELECT quantum FROM pools_pool WHERE pool_id = 'backfill'") == [(7,)]
        assert published_backfill_weight(env) == 7
    finally:
        assert demo.stop() == 0, demo.output()

    demo = start_demo(env, "--reset")
    try:
        assert sql(data_dir, "SELECT quantum FROM pools_pool WHERE pool_id = 'backfill'") == [(1,)]
        assert published_backfill_weight(env) == 1
    finally:
        assert demo.stop() == 0, demo.output()


@pytest.mark.timeout(300)
async def test_rundispatcher_gateway_id_reaches_history_and_the_queueing_switch_is_announced(
    tmp_path: Path,
    valkey_url: str,
    keys: KeySpace,
    aredis: aioredis.Redis,
    sredis: redis.Redis,
    history: HistoryClient,
) -> None:
    data_dir = tmp_path / "var"
    env = installation_env(data_dir, VALKEY_URL=valkey_url, DISPATCH_KEY_PREFIX=keys.prefix)
    await asyncio.to_thread(manage, env, "migrate", "--verbosity", "0")
    async with SimulatorServer(SimulatorConfig()) as sim:
        await asyncio.to_thread(manage, env, "seed_demo", "--endpoint", sim.url)
        sql(data_dir, "UPDATE pools_fabricgroup SET queueing_enabled = 0 WHERE group_id = 'demo'")
        identity = ["--gateway-id", "gw-test-7", "--dispatcher-id", "d-7"]
        dispatcher = Running([*MANAGE, "rundispatcher", "--group", "demo", *identity], env)
        try:
            await asyncio.to_thread(dispatcher.wait_for, "fabric group demo has queueing disabled", 90)
            config = await groups.load(aredis, keys, "demo")
            assert config is not None and not config.queueing_enabled  # published from the DB at start
            switched_on = replace(config, queueing_enabled=True, version=config.version + 1)
            await groups.publish(aredis, keys, switched_on)
            await asyncio.to_thread(dispatcher.wait_for, "queueing re-enabled for fabric group demo", 30)
            async with Producer(aredis, keys=keys) as producer:
                result = await producer.submit(CALL, pool_id="interactive", timeout=30)
            assert sim.completions_total == 1
        finally:
            code = await asyncio.to_thread(dispatcher.stop, signal.SIGTERM)
    assert code == 0, dispatcher.output()
    assert dispatcher.saw("(gateway gw-test-7)")
    assert dispatcher.saw(f"gc thresholds {gc_tuning.YOUNG_THRESHOLD}/")  # its collector tuned at start
    drain(Ingester(sredis, history, keys=keys, block_ms=50))  # the dispatcher flushed its spans on exit
    detail = queries.execution_detail(client=history, request_id=result.request_id)
    assert detail is not None
    assert (detail["execution"]["gateway"], detail["execution"]["dispatcher"]) == ("gw-test-7", "d-7")


@pytest.mark.timeout(600)
def test_the_demo_brings_a_killed_valkey_back_at_its_address_and_the_snippet_works_again(
    tmp_path: Path,
) -> None:
    data_dir, env, snippet = snippet_installation(tmp_path)
    demo = start_demo(env)
    try:
        before = embedded.running(data_dir)
        assert before is not None
        os.kill(before.pid, signal.SIGKILL)
        demo.wait_for("the embedded Valkey had stopped; restarted it at", 30)
        after = embedded.running(data_dir)
        assert after is not None and after.url == before.url
        run_snippet(snippet, env)
    finally:
        assert demo.stop() == 0, demo.output()
