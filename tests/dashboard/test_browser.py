"""The dashboard in headless Chromium against a real stack (see tests/dashboard/browser.py), under load."""

from __future__ import annotations

import asyncio
import time

from runtime.producer import Producer
from tests.dashboard.browser import BROWSER_MARKS, CHROMIUM, CHROMIUM_ARGS, SCREENSHOT, logged_in_page
from tests.runtime.harness import slow_call

pytestmark = BROWSER_MARKS


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
        page = await logged_in_page(browser, base)
        try:
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


LEGEND_SCREENSHOT = "/tmp/dashboard-legend.png"

# A person holds the button down for a moment; a table re-rendered in that moment swallows the click.
PRESS_MS = 150


async def test_pause_and_resume_take_one_plain_click_each_while_the_feed_is_busy(stack, aredis, keys) -> None:
    from playwright.async_api import async_playwright

    from runtime.wire.groupconfig import GroupConfig

    async def published_paused() -> bool:
        return GroupConfig.decode(await aredis.get(keys.group_config("demo"))).pool("backfill").paused

    async def published_resumed() -> bool:
        return not await published_paused()

    calls: list[asyncio.Task] = []
    async with (
        async_playwright() as pw,
        Producer(aredis, keys=keys, producer_id="browser-busy") as producer,
    ):
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await logged_in_page(browser, stack["url"])
        try:
            await page.wait_for_selector("#feed.ok", timeout=15_000)
            for pool_id in (
                "interactive",
                "backfill",
                "default",
            ) * 40:  # short calls: figures change constantly
                calls.append(
                    asyncio.create_task(producer.submit(slow_call(300), pool_id=pool_id, timeout=60))
                )
            await until(lambda: _gt(page, "backfill", "queue_depth", 0), "a backfill queue")
            changes = await page.evaluate(
                """() => new Promise(done => {
                    let n = 0;
                    new MutationObserver(list => { n += list.length; })
                        .observe(document.getElementById("pools"), {subtree: true, childList: true,
                                 characterData: true, attributes: true});
                    setTimeout(() => done(n), 1000);
                })"""
            )
            assert changes >= 3, "the pool table should be changing while we click"
            row = page.locator('tr[data-pool="backfill"]')
            for _ in range(3):
                await row.locator("button.pause").click(delay=PRESS_MS)
                await page.wait_for_selector('tr[data-pool="backfill"].paused button.resume', timeout=5_000)
                await until(published_paused, "the pause published to the dispatchers", timeout=5)
                await row.locator("button.resume").click(delay=PRESS_MS)
                await page.wait_for_selector(
                    'tr[data-pool="backfill"]:not(.paused) button.pause', timeout=5_000
                )
                await until(published_resumed, "the resume published to the dispatchers", timeout=5)
        finally:
            await browser.close()
            for task in calls:
                task.cancel()
            await asyncio.gather(*calls, return_exceptions=True)


async def test_reasons_a_newer_dispatcher_reports_show_up_explained(stack, aredis, keys) -> None:
    """A drop reason and a skip reason the dashboard has no words for yet still show, with a legend entry."""
    import orjson
    from playwright.async_api import async_playwright

    from tests.dashboard.test_merge import pool, snap

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await logged_in_page(browser, stack["url"])
        try:
            await page.wait_for_selector("#feed.ok", timeout=15_000)
            newer = snap(
                "newer-d2", time.time(), [pool("backfill", skips={"tenant_quota": 3})],
                group_id="demo", dropped={"lost_in_flight": 2, "shed_by_operator": 1},
            )  # fmt: skip
            await aredis.set(keys.snapshot("demo", "newer-d2"), orjson.dumps(newer), px=10_000)

            known_new = page.locator('#counters tr[data-key="drop:lost_in_flight"]')
            await known_new.wait_for(timeout=10_000)
            assert (await known_new.inner_text()).split("\t")[0] == "Dropped: Lost in flight"
            assert "lease expired" in (await known_new.locator("td").first.get_attribute("title") or "")
            unknown = page.locator('#counters tr[data-key="drop:shed_by_operator"] td').first
            assert await unknown.inner_text() == "Dropped: shed by operator"
            chip = page.locator('tr[data-pool="backfill"] .chip[title^="tenant_quota: "]')
            assert await chip.inner_text() == "tenant quota 3"
            await page.click("#legend summary")  # the legend opens on demand
            for kind, reason in (("drop", "shed_by_operator"), ("skip", "tenant_quota")):
                entry = page.locator(f'#legend-{kind} dt[data-reason="{reason}"]')
                assert await entry.is_visible(), reason
            await page.screenshot(path=LEGEND_SCREENSHOT, full_page=True)
        finally:
            await browser.close()
