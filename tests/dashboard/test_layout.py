"""Every operator page fits a 1280 px wide window without horizontal scrolling, with realistic data."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from runtime.producer import Producer
from tests.support.browser import BROWSER_MARKS, CHROMIUM, CHROMIUM_ARGS, logged_in_page
from tests.support.dispatching import slow_call
from tests.support.waiting import wait_until

pytestmark = BROWSER_MARKS

WIDTH = 1280
SHOTS = Path("/tmp/ui-layout")
POOLS = ("interactive", "document-extract", "backfill", "default")

# The pages an operator opens; {request} and {pool} are filled from the data the test creates.
PAGES = {
    "dashboard": "/fabric/demo/",
    "history": "/history/",
    "history-filtered": "/history/?pool=document-extract",
    "history-pools": "/history/pools/",
    "history-detail": "/history/request/{request}/",
    "admin": "/admin/",
    "admin-groups": "/admin/pools/fabricgroup/",
    "admin-group": "/admin/pools/fabricgroup/demo/change/",
    "admin-group-add": "/admin/pools/fabricgroup/add/",
    "admin-pools": "/admin/pools/pool/",
    "admin-pool": "/admin/pools/pool/{pool}/change/",
    "admin-pool-add": "/admin/pools/pool/add/",
    "admin-users": "/admin/auth/user/",
    "admin-user": "/admin/auth/user/1/change/",
    "admin-user-add": "/admin/auth/user/add/",
    "admin-auth-groups": "/admin/auth/group/",
    "admin-auth-group-add": "/admin/auth/group/add/",
}

# A box that scrolls sideways inside the page (the admin wraps its lists in one) hides columns too.
INNER_SCROLLERS = """() => Array.from(document.querySelectorAll("body *"))
    .filter(el => ["auto", "scroll"].includes(getComputedStyle(el).overflowX)
                  && el.scrollWidth > el.clientWidth + 1)
    .map(el => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + "." + el.className)"""


async def test_every_page_fits_1280_px_wide(stack, aredis, keys) -> None:
    from playwright.async_api import async_playwright

    base = stack["url"]
    SHOTS.mkdir(exist_ok=True)
    async with (
        async_playwright() as pw,
        Producer(
            aredis, keys=keys, producer_id="layout-load-with-a-realistically-long-producer-id"
        ) as producer,
    ):
        # Completed, failed (too few to open the breaker) and long-running work in every pool.
        done = [
            producer.submit(
                slow_call(20, **({"status": 503} if i % 8 == 0 else {})), pool_id=pool, timeout=30
            )
            for i, pool in enumerate(POOLS * 6)
        ]
        await asyncio.gather(*done, return_exceptions=True)
        running = [
            asyncio.create_task(producer.submit(slow_call(30_000), pool_id=pool, timeout=60))
            for pool in POOLS * 4
        ]
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await logged_in_page(browser, base, width=WIDTH, height=900)
            await page.wait_for_selector("#active tr[data-request]", timeout=15_000)
            link = page.locator('a[href^="/history/request/"]').first

            async def history_lists_a_request() -> bool:  # the ingester stores spans within a second or two
                await page.goto(f"{base}/history/")
                return bool(await link.count())

            await wait_until(history_lists_a_request, timeout=60, interval=0.3, what="a request in history")
            request = (await link.get_attribute("href") or "").rstrip("/").rsplit("/", 1)[-1]
            assert request, "no history row appeared"
            pool_pk = await pool_change_pk(page, base)
            # A paused pool, so its state shows on the dashboard and in the admin's pool list too.
            await page.goto(f"{base}/fabric/demo/")
            await page.locator('tr[data-pool="default"] button.pause').click()
            await page.wait_for_selector('tr[data-pool="default"].paused button.resume', timeout=5_000)
            too_wide, characters = {}, set()
            for name, path in PAGES.items():
                await page.goto(base + path.format(request=request, pool=pool_pk))
                if name == "dashboard":
                    await page.wait_for_selector("#feed.ok", timeout=15_000)
                width = await page.evaluate("document.documentElement.scrollWidth")
                scrollers = await page.evaluate(INNER_SCROLLERS)
                characters |= set(await page.evaluate("document.body.innerText"))
                await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
                if width > WIDTH or scrollers:
                    too_wide[name] = (width, scrollers)
            assert too_wide == {}, f"pages wider than {WIDTH} px (screenshots in {SHOTS})"
            undrawable = sorted(c for c in characters if ord(c) > 127 and not drawable(c))
            assert undrawable == [], "characters no installed font has (drawn as empty boxes)"
        finally:
            await browser.close()
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)


def drawable(character: str) -> bool:
    """True when some installed font has a glyph for the character (what Chromium draws with)."""
    found = subprocess.run(
        ["fc-list", f":charset={ord(character):x}", "family"], capture_output=True, text=True, check=True
    )
    return bool(found.stdout.strip())


async def pool_change_pk(page, base: str) -> str:
    await page.goto(f"{base}/admin/pools/pool/")
    href = await page.locator('a[href*="/admin/pools/pool/"][href$="/change/"]').first.get_attribute("href")
    return (href or "").rstrip("/").split("/")[-2]
