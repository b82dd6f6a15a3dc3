"""The operational commands as an operator runs them: real processes, real signals."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runtime.errors import RequestTimeout
from runtime.producer import Producer
from runtime.valkey import embedded
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher
from tests.support.dispatching import CALL, one_pool_group, slow_call
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
async def test_sigterm_lets_in_flight_calls_finish_and_reply_then_exits_zero(
    aredis, keys, valkey_url
) -> None:
    from runtime.queue import groups

    async with SimulatorServer(SimulatorConfig()) as sim:
        await groups.publish(aredis, keys, one_pool_group(sim.url, group_id="term"))
        proc = start_dispatcher(valkey_url, keys.prefix, "term", "d-term")
        async with Producer(aredis, keys=keys) as producer:
            calls = [
                asyncio.create_task(producer.submit(slow_call(1500), pool_id="default", timeout=20))
                for _ in range(4)
            ]
            await wait_until(lambda: sim.running == 4, what="four calls running at the backend")
            proc.send_signal(signal.SIGTERM)

            async def dispatcher_stopping() -> bool:  # its live snapshot says it took the signal
                raw = await aredis.get(keys.snapshot("term", "d-term"))
                return bool(raw) and orjson.loads(raw)["stopping"]

            await wait_until(dispatcher_stopping, what="the dispatcher stopping")
            late = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=3))
            results = await asyncio.gather(*calls)
            code = await asyncio.to_thread(proc.wait, 20)
            assert code == 0
            assert all(r.completion["choices"] for r in results)
            with pytest.raises(RequestTimeout):
                await late  # taken by nobody: the stopping dispatcher took no new work
    assert sim.completions_total == 4


@pytest.mark.django_db
def test_rundispatcher_refuses_an_unknown_group_or_a_group_without_pools() -> None:
    from pools.models import FabricGroup

    with pytest.raises(CommandError, match="no fabric group 'nope'"):
        call_command("rundispatcher", "--group", "nope")
    FabricGroup.objects.create(group_id="empty", name="Empty", total_concurrency=4)
    with pytest.raises(CommandError, match="has no enabled pools"):
        call_command("rundispatcher", "--group", "empty")


def test_rundispatcher_refuses_bad_settings(group_g) -> None:
    with pytest.raises(CommandError, match="concurrency must be at least 1"):
        call_command("rundispatcher", "--group", "g", "--concurrency", "0", "--no-publish")


@pytest.mark.slow
def test_demo_brings_everything_up_and_ctrl_c_stops_it(tmp_path: Path) -> None:
    port, sim_port, ingress_port = embedded.free_port(), embedded.free_port(), embedded.free_port()
    env = {**os.environ, "DISPATCH_DATA_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("VALKEY_URL", None)
    env.pop("DATABASE_URL", None)
    demo = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "demo",
            "--port",
            str(port),
            "--sim-port",
            str(sim_port),
            "--ingress-port",
            str(ingress_port),
            "--load-scale",
            "3",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        deadline = time.monotonic() + 90
        # Reads the demo's output line by line (blocking reads, no polling) up to the first load report.
        while not any(line.startswith("[loadgen]") and " ok " in line for line in lines):
            assert time.monotonic() < deadline and demo.poll() is None, "".join(lines)
            lines.append(demo.stdout.readline())
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", follow_redirects=True, timeout=10) as web:
            login = web.get("/admin/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
            page = web.post(
                "/admin/login/?next=/",
                data={"username": "admin", "password": "admin", "csrfmiddlewaretoken": token, "next": "/"},
            )
            assert page.status_code == 200 and "interactive" in page.text
            metrics = web.get("/metrics").text
            assert 'llm_dispatch_queue_depth{fabric_group="demo",pool="backfill"}' in metrics
        assert f"OpenAI API: http://127.0.0.1:{ingress_port}/v1" in "".join(lines)
        # The ingress process answers /v1 (here: OpenAI's error for a call without a key).
        refused = httpx.get(f"http://127.0.0.1:{ingress_port}/v1/models", timeout=10)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "missing_api_key"
        served = re.findall(r"interactive: sent \d+ ok (\d+)", "".join(lines))
        assert served and int(served[-1]) > 0
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        out, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    assert demo.returncode == 0, out
    assert "demo stopped." in out
    assert embedded.running(tmp_path) is None  # the embedded Valkey it started is gone too
    leftovers = subprocess.run(["pgrep", "-f", f"--port {sim_port}"], capture_output=True, text=True).stdout
    assert leftovers.strip() == ""
