"""The dashboard in headless Chromium against a real stack (see tests/support/browser.py), under load."""

from __future__ import annotations

import asyncio
import re
import time

import orjson

from runtime.producer import Producer
from tests.support.browser import (
    BROWSER_MARKS,
    CHROMIUM,
    CHROMIUM_ARGS,
    SCREENSHOT,
    live_dashboard,
    logged_in_page,
)
from tests.support.dispatching import slow_call
from tests.support.waiting import wait_until

pytestmark = BROWSER_MARKS


async def figure(page, pool_id: str, field: str) -> int:
    text = await page.locator(f'tr[data-pool="{pool_id}"] [data-f="{field}"]').inner_text()
    return int(text) if text.strip().isdigit() else 0


async def until(check, what: str, timeout: float = 20.0) -> None:
    await wait_until(check, timeout, interval=0.2, what=f"the dashboard showing {what}")


async def test_dashboard_updates_live_and_pauses_a_pool(stack, aredis, keys) -> None:
    from playwright.async_api import async_playwright

    base = stack["url"]
    calls: list[asyncio.Task] = []

    async def dispatcher_paused_backfill() -> bool:
        raw = await aredis.get(keys.snapshot("demo", "browser-d1"))
        pools = orjson.loads(raw)["pools"] if raw else []
        return any(p["pool_id"] == "backfill" and p["paused"] for p in pools)

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
            await until(dispatcher_paused_backfill, "the dispatcher applying the pause")

            async def page_shows_the_queue() -> bool:  # a frame from after the pause: backfill drains no more
                return await figure(page, "backfill", "queue_depth") == await aredis.llen(
                    keys.requests("backfill")
                )

            await until(page_shows_the_queue, "the paused queue's length")
            before = await figure(page, "backfill", "queue_depth")
            load("backfill", 15, 10)
            await until(lambda: _ge(page, "backfill", "queue_depth", before + 15), "the paused queue growing")
            await until(
                lambda: _tile_gt(page, "completed", 0), "completions"
            )  # the group's counters refresh while busy
            # Steady state for the screenshot: the row says "paused", no longer "pausing…".
            paused_pill = page.locator('tr[data-pool="backfill"] .pill', has_text=re.compile(r"^paused$"))
            await paused_pill.wait_for(timeout=10_000)
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


BUTTON_BOXES = """() => Array.from(document.querySelectorAll("#pools tr[data-pool] button")).map(b => {
    const r = b.getBoundingClientRect();
    return [b.closest("tr").dataset.pool, r.x, r.y, r.width, r.height];
})"""


async def test_the_pool_buttons_stay_put_whatever_the_live_figures_show(stack, aredis, keys) -> None:
    """Long figures, many held-back reasons, pills and refusals change the rows' text, never where a
    Pause/Resume button is: a button that moves between mouse-down and mouse-up loses the click."""
    from tests.support.snapshots import pool, snap

    pool_ids = ("interactive", "document-extract", "backfill", "default")
    many = {r: 123_456 for r in ("no_credit", "capacity", "group_capacity", "reserved", "breaker_open",
                                  "backend_saturated", "tenant_quota", "paused")}  # fmt: skip
    async with live_dashboard(stack["url"]) as page:
        await page.wait_for_selector('tr[data-pool="default"] button.pause')
        before = await page.evaluate(BUTTON_BOXES)
        assert [box[0] for box in before] == list(pool_ids)
        # A dispatcher whose clock runs ahead: its figures are the freshest, so they are the ones shown.
        loud = snap(
            "loud-d2", time.time() + 30,
            [pool(p, display_name=f"A much longer display name for {p}", enabled=p != "default",
                  queue_depth=987_654, in_flight=12_345, max_concurrent=99_999, min_concurrent=4_321,
                  deficit=-98_765, oldest_pending_age_s=98_765.4, head_cost=87_654, skips=many)
             for p in pool_ids],
            group_id="demo",
        )  # fmt: skip
        await aredis.set(keys.snapshot("demo", "loud-d2"), orjson.dumps(loud), px=60_000)
        await aredis.hset(keys.rejections(), mapping={f"{p}:queue_full": 76_543 for p in pool_ids})
        for shown in (
            page.locator('tr[data-pool="interactive"] .chip[title^="tenant_quota: "]'),
            page.locator('tr[data-pool="default"] .pill', has_text="disabled"),
            page.locator('tr[data-pool="backfill"] [data-f="rejected"]', has_text="76543"),
        ):
            await shown.wait_for(timeout=10_000)
        assert await page.evaluate(BUTTON_BOXES) == before


async def test_reasons_a_newer_dispatcher_reports_show_up_explained(stack, aredis, keys) -> None:
    """A drop reason and a skip reason the dashboard has no words for yet still show, with a legend entry."""

    from tests.support.snapshots import pool, snap

    async with live_dashboard(stack["url"]) as page:
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


async def test_a_dead_letter_shows_up_live_and_is_replayed_from_the_admin(stack, aredis, keys) -> None:
    """A dead letter appears on the open dashboard; its link leads to the admin, where Replay queues it."""
    from runtime.wire.contract import Envelope
    from tests.support.pools_admin import dead_letter

    async with live_dashboard(stack["url"]) as page:
        assert await page.locator('[data-v="dead_letters_total"]').inner_text() == "0"
        # Paused, so the replayed request stays visibly queued instead of running at once.
        await page.click('tr[data-pool="backfill"] button.pause')
        await page.wait_for_selector('tr[data-pool="backfill"].paused button.resume', timeout=10_000)
        await aredis.rpush(keys.dead_letters("backfill"), dead_letter("r-dead", dead_at=time.time() - 30))
        row = page.locator("#dead-letters tr", has_text="backfill")
        await row.wait_for(timeout=10_000)
        assert await page.locator('[data-v="dead_letters_total"]').inner_text() == "1"
        await row.get_by_role("link", name="replay or discard").click()
        await page.wait_for_selector("#dead-letters tr.dead-letter")
        assert "attempts_exhausted" in await page.locator("#dead-letters").inner_text()
        await page.get_by_role("button", name="Replay").click()
        await page.wait_for_selector("#no-dead-letters")
        assert "Replayed dead letter request r-dead" in await page.locator(".messagelist").inner_text()
        [queued] = await aredis.lrange(keys.requests("backfill"), 0, -1)
        assert Envelope.decode(queued).request_id == "r-dead"


async def test_the_runtime_table_shows_which_valkey_each_dispatcher_uses(
    stack, aredis, keys, valkey_url
) -> None:
    """The real dispatcher's row names the server it is connected to; a dispatcher that moved to another
    primary (a failover) shows that address and since when, live; one from before the field shows none."""
    from tests.support.snapshots import pool, snap

    def row(page, dispatcher_id: str):  # type: ignore[no-untyped-def]
        return page.locator("#dispatchers tr", has=page.locator("code", has_text=dispatcher_id))

    server = valkey_url.split("//", 1)[1].split("/", 1)[0]
    async with live_dashboard(stack["url"]) as page:
        real = row(page, "browser-d1").locator("code.valkey-server")
        await real.wait_for(timeout=10_000)
        assert await real.inner_text() == server
        moved_at = time.time() - 5
        moved = snap(
            "moved-d3", time.time(), [pool("interactive")], group_id="demo",
            valkey="10.0.0.22:6379", valkey_reconnected_at=moved_at,
        )  # fmt: skip
        older = snap("older-d4", time.time(), [pool("interactive")], group_id="demo")
        await aredis.set(keys.snapshot("demo", "moved-d3"), orjson.dumps(moved), px=10_000)
        await aredis.set(keys.snapshot("demo", "older-d4"), orjson.dumps(older), px=10_000)
        address = row(page, "moved-d3").locator("code.valkey-server")
        await address.wait_for(timeout=10_000)
        assert await address.inner_text() == "10.0.0.22:6379"
        since = await row(page, "moved-d3").locator("small", has_text="since").inner_text()
        shown = await page.evaluate(f"new Date({moved_at} * 1000).toLocaleTimeString()")
        assert since == f"since {shown}"
        await row(page, "older-d4").wait_for(timeout=10_000)
        assert await row(page, "older-d4").locator("code.valkey-server").count() == 0


async def test_a_noisy_tenant_shows_at_the_top_of_its_fair_pools_tenants(
    stack, aredis, keys, valkey_url
) -> None:
    """Backfill switched to tenant fairness in the admin's model; a noisy tenant's 30 slow calls and a
    quiet one's 2: the live tenants table lists the noisy tenant first, queued and in flight."""
    import subprocess
    import sys

    from runtime.wire.groupconfig import GroupConfig
    from tests.support.browser import ROOT, stack_env

    code = (
        "from pools import services; from pools.models import Pool; "
        "pool = Pool.objects.get(pool_id='backfill'); pool.tenant_fairness = 'requests'; "
        "services.pool_save(pool=pool)"
    )
    env = stack_env(stack["logs"], valkey_url, keys)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env, check=True)

    async def published_fair() -> bool:
        config = GroupConfig.decode(await aredis.get(keys.group_config("demo")))
        return config.pool("backfill").tenant_fairness == "requests"

    await wait_until(published_fair, 10.0, interval=0.1, what="backfill published as fair")
    calls: list[asyncio.Task] = []
    async with (
        live_dashboard(stack["url"]) as page,
        Producer(aredis, keys=keys, producer_id="browser-tenants") as producer,
    ):
        try:
            # The quiet tenant's calls are long, so they stay listed (in flight) once fairness starts them.
            for tenant, n, ms in (("key-noisy", 30, 1500), ("key-quiet", 2, 15_000)):
                for _ in range(n):
                    call = producer.submit(slow_call(ms), pool_id="backfill", timeout=60, tenant=tenant)
                    calls.append(asyncio.create_task(call))
            first = page.locator("#tenants tr").first

            async def noisy_on_top() -> bool:
                cells = (await first.inner_text()).split("\t")
                if len(cells) < 4:
                    return False  # "No tenant queued or in flight." until the first frame with calls
                return "key-noisy" in cells[1] and int(cells[2]) > 2 and int(cells[3]) > 0

            await until(noisy_on_top, "the noisy tenant first, queued and in flight")
            assert (await first.inner_text()).startswith("backfill")
            quiet = page.locator('#tenants tr[data-tenant="backfill/key-quiet"] td')

            async def quiet_in_flight_below() -> bool:
                rows = await page.locator("#tenants tr").evaluate_all("rs => rs.map(r => r.dataset.tenant)")
                return rows[-1:] == ["backfill/key-quiet"] and await quiet.nth(3).inner_text() == "2"

            await until(quiet_in_flight_below, "the quiet tenant's two calls in flight, below the noisy one")
            assert "key-noisy" in await first.inner_text()
        finally:
            for task in calls:
                task.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
