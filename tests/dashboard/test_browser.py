"""The dashboard in headless Chromium against a real stack: daphne, a dispatcher, the simulator, load.

Everything but the producer runs as its own process, as in production: ``manage.py simbackend``,
``manage.py rundispatcher --group demo`` and ``daphne``, sharing the test Valkey under a unique key
prefix. Uses the system Chromium (``apt-get install chromium``); never ``playwright install``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.producer import Producer
from runtime.valkey.embedded import free_port
from tests.runtime.harness import slow_call

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
PASSWORD = "browser-test-pw"
SCREENSHOT = "/tmp/dashboard.png"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="system Chromium not installed"),
]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port}")


@pytest.fixture
def stack(tmp_path: Path, valkey_url: str, keys) -> Iterator[dict]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "dispatch_project.settings",
        "DISPATCH_DATA_DIR": str(tmp_path),
        "VALKEY_URL": valkey_url,
        "DISPATCH_KEY_PREFIX": keys.prefix,
        "DISPATCH_LOG_LEVEL": "WARNING",
    }
    manage = [sys.executable, "manage.py"]
    procs: list[subprocess.Popen] = []

    def start(args: list[str], name: str) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    sim_port, web_port = free_port(), free_port()
    sim = start([*manage, "simbackend", "--port", str(sim_port)], "sim")
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    wait_for_port(sim_port, sim)
    subprocess.run(
        [*manage, "seed_demo", "--endpoint", f"http://127.0.0.1:{sim_port}/v1", "--admin-password", PASSWORD],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    start(
        [*manage, "rundispatcher", "--group", "demo", "--dispatcher-id", "browser-d1", "--grace", "1"], "disp"
    )
    web = start([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port),
                 "dispatch_project.asgi:application"], "daphne")  # fmt: skip
    wait_for_port(web_port, web)
    try:
        yield {"url": f"http://127.0.0.1:{web_port}", "logs": tmp_path}
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def figure(page, pool_id: str, field: str) -> int:
    text = await page.locator(f'tr[data-pool="{pool_id}"] [data-f="{field}"]').inner_text()
    return int(text) if text.strip().isdigit() else 0


async def until(check, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"the dashboard did not show {what} in time"
        await asyncio.sleep(0.2)


async def test_dashboard_updates_live_and_pauses_a_pool(stack, aredis, keys) -> None:
    from playwright.async_api import async_playwright

    base = stack["url"]
    calls: list[asyncio.Task] = []
    async with (
        async_playwright() as pw,
        Producer(aredis, keys=keys, producer_id="browser-load") as producer,
    ):
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1440, "height": 1000})
        try:
            await page.goto(f"{base}/")
            assert "/admin/login/" in page.url  # anonymous: to the login form
            await page.fill("#id_username", "admin")
            await page.fill("#id_password", PASSWORD)
            await page.click("input[type=submit]")
            await page.wait_for_url(f"{base}/fabric/demo/")
            await page.wait_for_selector("#feed.ok", timeout=15_000)  # the dispatcher's feed is live
            await page.evaluate("window.__notReloaded = true")
            assert await figure(page, "interactive", "in_flight") == 0

            def load(pool_id: str, n: int, latency_ms: float) -> None:
                for _ in range(n):
                    call = producer.submit(slow_call(latency_ms), pool_id=pool_id, timeout=60)
                    calls.append(asyncio.create_task(call))

            load("interactive", 30, 1500)
            load("backfill", 30, 1500)
            await until(lambda: _gt(page, "interactive", "in_flight", 0), "interactive in flight")
            await until(lambda: _gt(page, "backfill", "queue_depth", 0), "a backfill queue")
            assert int(await page.locator('[data-v="group_in_flight"]').inner_text()) > 0
            assert await page.locator("#active tr code").count() > 0

            await page.click('tr[data-pool="backfill"] button.pause')
            await page.wait_for_selector('tr[data-pool="backfill"].paused button.resume', timeout=10_000)
            await asyncio.sleep(1.0)  # the dispatcher has the new configuration; backfill drains no more
            before = await figure(page, "backfill", "queue_depth")
            load("backfill", 15, 10)
            await until(lambda: _ge(page, "backfill", "queue_depth", before + 15), "the paused queue growing")
            await until(
                lambda: _tile_gt(page, "completed", 0), "completions"
            )  # the group's counters refresh while busy
            await page.wait_for_timeout(1000)  # a few more live frames so the screenshot shows steady state
            assert await page.evaluate("window.__notReloaded === true")
            await page.screenshot(path=SCREENSHOT, full_page=True)
        finally:
            await browser.close()
            for task in calls:
                task.cancel()
            await asyncio.gather(*calls, return_exceptions=True)


async def _gt(page, pool_id: str, field: str, value: int) -> bool:
    return await figure(page, pool_id, field) > value


async def _ge(page, pool_id: str, field: str, value: int) -> bool:
    return await figure(page, pool_id, field) >= value


async def _tile_gt(page, name: str, value: int) -> bool:
    return int(await page.locator(f'[data-v="{name}"]').inner_text()) > value
