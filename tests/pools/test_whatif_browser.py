"""The What-if panel in headless Chromium: opened from a pool's form (then the group's), a weight
changed, the predicted table read.

A real web server (daphne) on a demo group whose history (real chDB, written before the server
starts: one engine per directory and process) holds two minutes of overloaded traffic.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.valkey.embedded import free_port
from tests.support.browser import BROWSER_MARKS, CHROMIUM, CHROMIUM_ARGS, PASSWORD, ROOT, stack_env
from tests.support.waiting import wait_for_port

pytestmark = BROWSER_MARKS
ASGI = "dispatch_project.asgi:application"

# Two minutes of the demo group over its 16 slots: interactive 10/s, document-extract 2/s, backfill
# 10/s, every call 1 s. Interactive (weight 4) and backfill (weight 1) are both backlogged, so their
# weights split the slots the caps leave.
FILL_HISTORY = textwrap.dedent(
    """
    import sys, time
    from history import schema
    from history.client import client_for
    from tests.support.history_spans import execution_doc, store
    client = client_for(sys.argv[1])
    schema.migrate(client, retention_days=30)
    now, docs = time.time_ns(), []
    for pool, per_s in (("interactive", 10), ("document-extract", 2), ("backfill", 10)):
        for k in range(120 * per_s):
            at = now - 125 * 10**9 + k * 10**9 // per_s
            docs.append(execution_doc(pool=pool, group="demo", queue_wait=0.0, execution=1.0, start_ns=at))
    store(client, docs)
    """
)


@pytest.fixture
def web(tmp_path: Path, valkey_url: str, keys) -> Iterator[str]:  # type: ignore[no-untyped-def]
    env = stack_env(tmp_path, valkey_url, keys)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [*manage, "seed_demo", "--endpoint", "http://127.0.0.1:9/v1", "--admin-password", PASSWORD],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-c", FILL_HISTORY, f"chdb://{tmp_path / 'clickhouse'}"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    port = free_port()
    with open(tmp_path / "daphne.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), ASGI],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def ms(text: str) -> float:
    value, unit = text.split()
    return float(value) / 1000 if unit == "ms" else float(value)


async def test_whatif_from_the_pool_form_predicts_shorter_waits_for_a_heavier_weight(web: str) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1440, "height": 1000})
            await page.goto(f"{web}/admin/login/?next=/admin/pools/pool/")
            await page.fill("#id_username", "admin")
            await page.fill("#id_password", PASSWORD)
            await page.click("input[type=submit]")
            await page.click("#result_list a:text-is('backfill')")
            await page.wait_for_selector("#whatif-open")
            assert await page.locator("#whatif-panel").is_hidden()

            await page.click("#whatif-open")
            await page.wait_for_selector("#whatif-panel[data-runs='1']")
            backfill = page.locator("#whatif-output section[data-pool='backfill']")
            assert await page.locator("#whatif-panel").is_visible()
            # Nothing edited yet: proposed is the saved configuration.
            current = await backfill.locator("tr.whatif-current td").first.inner_text()
            assert await backfill.locator("tr.whatif-proposed td").first.inner_text() == current

            await page.fill("#id_quantum", "8")
            await page.click("#whatif-run")
            await page.wait_for_selector("#whatif-panel[data-runs='2']")
            proposed = await backfill.locator("tr.whatif-proposed td").first.inner_text()
            assert ms(proposed) < ms(await backfill.locator("tr.whatif-current td").first.inner_text())
            first = page.locator("#whatif-output section.whatif-pool").first
            assert await first.get_attribute("data-pool") == "backfill"  # the pool's own rows come first
            assert await backfill.locator("svg").count() == 1
            await page.screenshot(path="/tmp/whatif.png", full_page=True)
            # Nothing was saved: the form still holds the unsaved edit, the database the old weight.
            assert "/change/" in page.url

            # The group's page: its pool inline's values go to the replay the same way.
            await page.goto(f"{web}/admin/pools/fabricgroup/demo/change/")
            await page.click("#whatif-open")
            await page.wait_for_selector("#whatif-panel[data-runs='1']")
            row = page.locator("tr.form-row", has=page.locator("input[name$='-pool_id'][value='backfill']"))
            await row.locator("input[name$='-quantum']").fill("8")
            await page.click("#whatif-run")
            await page.wait_for_selector("#whatif-panel[data-runs='2']")
            backfill = page.locator("#whatif-output section[data-pool='backfill']")
            assert ms(await backfill.locator("tr.whatif-proposed td").first.inner_text()) == ms(proposed)
        finally:
            await browser.close()
