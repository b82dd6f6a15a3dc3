"""DISPATCH_VALKEY_HEALTH_S reaches every process's Valkey client, and a bad value is refused."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ops.runtime_settings import dispatcher_settings, producer_settings
from pools import connections


def test_the_health_check_setting_reaches_the_runtime_settings(settings) -> None:
    settings.DISPATCH_VALKEY_HEALTH_S = 2.5
    assert dispatcher_settings("g").valkey_health_s == 2.5
    assert producer_settings().valkey_health_s == 2.5


def test_the_web_processs_valkey_reads_time_out_after_the_health_check(settings, valkey_url) -> None:
    connections.valkey_url.cache_clear()
    settings.VALKEY_URL = valkey_url
    settings.DISPATCH_VALKEY_HEALTH_S = 2.5
    try:
        assert connections.sync_client().connection_pool.connection_kwargs["socket_timeout"] == 2.5
    finally:
        connections.valkey_url.cache_clear()


def test_rundispatcher_refuses_a_health_check_that_is_not_positive(settings, group_g) -> None:
    settings.DISPATCH_VALKEY_HEALTH_S = 0
    with pytest.raises(CommandError, match="Valkey health check must be more than 0"):
        call_command("rundispatcher", "--group", "g", "--no-publish")


def test_the_history_ingester_blocks_well_within_the_health_check(
    settings, valkey_url, ch_url, history
) -> None:
    """Its blocking XREADGROUP shares the web client's socket_timeout: it must never run into it."""
    from history.ingester import build_from_settings

    connections.valkey_url.cache_clear()
    settings.VALKEY_URL, settings.CLICKHOUSE_URL = valkey_url, ch_url
    settings.DISPATCH_VALKEY_HEALTH_S = 0.4
    try:
        ingester = build_from_settings()
        # An idle stream: the blocking read waits, then answers nothing, without running into a timeout.
        assert ingester.step() == 0 and ingester.step() == 0
        assert ingester.block_ms < 0.4 * 1000
    finally:
        connections.valkey_url.cache_clear()
