"""The dashboard under the production profile of docs/deploy.md, in headless Chromium.

DEBUG off, the documented settings, ``collectstatic`` run, daphne started as its systemd unit starts
it, behind a TLS-terminating proxy (tests/support/tls_proxy.py, doing what the doc's nginx does): a
person logs in over HTTPS and gets the dashboard with its stylesheets and script (served by WhiteNoise
under hashed names) and the live feed over the proxied websocket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.valkey.embedded import free_port
from tests.support.browser import BROWSER_MARKS, CHROMIUM, CHROMIUM_ARGS, demo_stack, log_in
from tests.support.production_profile import production_env
from tests.support.tls_proxy import tls_proxy

pytestmark = BROWSER_MARKS


async def _settled(in_flight: set[Any], within_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + within_s
    while in_flight:
        assert asyncio.get_running_loop().time() < deadline, [r.url for r in in_flight]
        await asyncio.sleep(0.05)


@pytest.fixture
def production(tmp_path: Path, valkey_url: str, keys) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    proxy_port = free_port()
    env = production_env(
        tmp_path,
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        DJANGO_CSRF_TRUSTED_ORIGINS=f"https://127.0.0.1:{proxy_port}",
    )
    with demo_stack(tmp_path, env, valkey_url, keys, "--proxy-headers", collectstatic=True) as running:
        yield {**running, "proxy_port": proxy_port}


async def test_the_dashboard_works_with_debug_off_behind_a_tls_proxy(production: dict[str, Any]) -> None:
    from playwright.async_api import async_playwright

    daphne = production["url"]
    # Straight to daphne in plain HTTP (no proxy header): sent to HTTPS, and no static file from the apps.
    direct = httpx.get(f"{daphne}/admin/login/", headers={"Host": "127.0.0.1"})
    assert direct.status_code == 301 and direct.headers["location"].startswith("https://")

    async with tls_proxy(daphne, production["proxy_port"], production["logs"]) as base:
        static: dict[str, tuple[int, str]] = {}
        failed: list[str] = []
        in_flight: set[Any] = set()
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = await browser.new_context(ignore_https_errors=True)
                login = await context.new_page()
                await log_in(login, base)
                # A fresh tab of the logged-in session, hooked before it asks for anything: what the
                # login tab still had on the wire (its favicon) is not this page's to fail.
                page = await context.new_page()
                page.on("request", lambda r: in_flight.add(r))
                page.on("requestfinished", lambda r: in_flight.discard(r))
                page.on(
                    "requestfailed", lambda r: (in_flight.discard(r), failed.append(f"{r.url}: {r.failure}"))
                )
                page.on(
                    "response",
                    lambda r: (
                        "/static/" in r.url
                        and static.update({r.url: (r.status, r.headers.get("cache-control", ""))})
                    ),
                )
                # Every static file this logged-in page asks for, seen by the hooks.
                dashboard = await page.goto(login.url)
                await page.wait_for_selector("#feed.ok", timeout=15_000)  # script ran, websocket live
                cookies = {c["name"]: c for c in await page.context.cookies()}
                sheets = await page.evaluate(
                    "[...document.styleSheets].map(s => [s.href, s.cssRules.length])"
                )
                # Closing the browser cancels what is still loading (the favicon comes after the load
                # event): every request the page made must have finished or failed on its own first.
                await _settled(in_flight)
            finally:
                await browser.close()

    assert not failed, failed
    assert dashboard is not None and dashboard.headers["strict-transport-security"].startswith("max-age=")
    assert static and {status for status, _ in static.values()} == {200}, static
    assert all("immutable" in cache for _, cache in static.values()), static
    hashed = [url for url in static if url.endswith((".css", ".js"))]
    # collectstatic's manifest names (fabric.0123abcd4567.css): the files WhiteNoise serves, not the apps'.
    assert len(hashed) >= 3 and all(url.rsplit("/", 1)[1].count(".") == 2 for url in hashed), hashed
    assert all(rules > 0 for _, rules in sheets), sheets
    assert cookies["sessionid"]["secure"] and cookies["csrftoken"]["secure"]
