"""Issue 24: the backend page's "Test connection" button in headless Chromium, against a real stack
(daphne serving the admin, the simulator as backend ``sim``; see tests/support/browser.py)."""

from __future__ import annotations

from tests.support.browser import BROWSER_MARKS, CHROMIUM, CHROMIUM_ARGS, logged_in_page

pytestmark = BROWSER_MARKS


async def test_test_connection_is_one_click_on_the_backend_page(stack) -> None:
    from playwright.async_api import async_playwright

    base = stack["url"]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await logged_in_page(browser, base)
            await page.goto(f"{base}/admin/pools/backend/sim/change/")
            await page.click("#test-connection")
            await page.wait_for_url(f"{base}/admin/pools/backend/sim/test-connection/")
            await page.wait_for_selector("#parsed-load")
            assert await page.locator("#models li").all_inner_texts() == ["sim-model"]
            gauges = await page.locator("#gauges-read").inner_text()
            assert gauges == (
                "Gauges read: vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc"
            )
            assert (await page.locator("#parsed-load").inner_text()).startswith("Load: running 0, waiting 0")
            assert await page.locator(".errornote").count() == 0
            await page.click("text=Back to Simulator (vLLM-like)")
            await page.wait_for_url(f"{base}/admin/pools/backend/sim/change/")
        finally:
            await browser.close()
