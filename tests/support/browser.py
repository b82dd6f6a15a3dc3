"""Browser test plumbing: a real stack (daphne, dispatcher, simulator on the test Valkey) and Chromium.

Everything but the producer runs as its own process, as in production: ``manage.py simbackend``,
``manage.py rundispatcher --group demo`` and ``daphne``, sharing the test Valkey under a unique key
prefix. Uses the system Chromium (``apt-get install chromium``); never ``playwright install``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.valkey.embedded import free_port
from tests.support.waiting import wait_for_port

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
PASSWORD = "browser-test-pw"
SCREENSHOT = "/tmp/dashboard.png"

BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.slow,  # each test starts a whole stack and a browser
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="system Chromium not installed"),
]


def stack_env(
    tmp_path: Path, valkey_url: str, keys, base_env: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of the stack's processes: a data directory of the test's, the test Valkey."""
    return {
        **(base_env if base_env is not None else os.environ),
        "DJANGO_SETTINGS_MODULE": "dispatch_project.settings",
        "DISPATCH_DATA_DIR": str(tmp_path),
        "VALKEY_URL": valkey_url,
        "DISPATCH_KEY_PREFIX": keys.prefix,
        "DISPATCH_LOG_LEVEL": "WARNING",
    }


@pytest.fixture
def stack(tmp_path: Path, valkey_url: str, keys) -> Iterator[dict]:
    with demo_stack(tmp_path, {**os.environ, "DJANGO_SETTINGS_MODULE": "dispatch_project.settings"},
                    valkey_url, keys) as running:  # fmt: skip
        yield running


@contextlib.contextmanager
def demo_stack(
    tmp_path: Path, base_env: dict[str, str], valkey_url: str, keys, *web_args: str,
    collectstatic: bool = False,
) -> Iterator[dict]:  # fmt: skip
    """The demo group on the simulator, a dispatcher and daphne (``web_args`` added), in ``base_env``."""
    env = {**base_env, **stack_env(tmp_path, valkey_url, keys, base_env)}
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
    if collectstatic:
        subprocess.run([*manage, "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True)
    web = start([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port), *web_args,
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


async def logged_in_page(browser, base: str, *, width: int = 1440, height: int = 1000, **options: Any):
    """A new page (``options`` of ``new_page``) logged in as the demo admin, on the demo group's dashboard."""
    page = await browser.new_page(viewport={"width": width, "height": height}, **options)
    await log_in(page, base)
    return page


async def log_in(page, base: str) -> None:  # type: ignore[no-untyped-def]
    """Logs ``page`` in as the demo admin, through the login form, onto the demo group's dashboard."""
    await page.goto(f"{base}/")
    assert "/admin/login/" in page.url  # anonymous: to the login form
    await page.fill("#id_username", "admin")
    await page.fill("#id_password", PASSWORD)
    await page.click("input[type=submit]")
    await page.wait_for_url(f"{base}/fabric/demo/")


@contextlib.asynccontextmanager
async def live_dashboard(base: str) -> AsyncIterator[Any]:
    """Chromium on the demo group's dashboard, logged in, once its dispatcher feed is live."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await logged_in_page(browser, base)
            await page.wait_for_selector("#feed.ok", timeout=15_000)
            yield page
        finally:
            await browser.close()
