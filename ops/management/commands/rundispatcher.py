"""``manage.py rundispatcher --group NAME``: run one dispatcher process of a fabric group."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from django.conf import settings as django_settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ops.config_guard import ConfigGuard
from ops.queueing import OperatorDispatcher
from ops.runtime_settings import dispatcher_settings, start_tracing
from pools.connections import key_space, valkey_url
from runtime import eventloop, gc_tuning
from runtime.config import DispatcherSettings
from runtime.valkey.client import connect

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Run a dispatcher for one fabric group until SIGTERM/SIGINT (graceful: in-flight calls finish). "
        "For a group with queueing disabled it logs so, and only drains requests queued before the switch: "
        "producers call that group's endpoint directly."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--group", required=True, help="fabric group id (slug)")
        parser.add_argument(
            "--concurrency",
            type=int,
            help="calls this process runs at once "
            f"(default: DISPATCH_CONCURRENCY, {django_settings.DISPATCH_CONCURRENCY})",
        )
        parser.add_argument(
            "--dispatcher-id",
            help="stable identity shown on the dashboard and in history (default: host-pid)",
        )
        parser.add_argument(
            "--gateway-id",
            help="gateway identity stored on every span "
            f"(default: DISPATCH_GATEWAY_ID, {django_settings.DISPATCH_GATEWAY_ID})",
        )
        parser.add_argument(
            "--grace",
            type=float,
            help="seconds in-flight calls get to finish on shutdown "
            f"(default: DISPATCH_SHUTDOWN_GRACE_S, {django_settings.DISPATCH_SHUTDOWN_GRACE_S})",
        )
        parser.add_argument(
            "--no-publish",
            action="store_true",
            help="do not republish the configuration from the database, neither at start nor when Valkey "
            "comes back without it",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from pools import selectors, services
        from pools.models import FabricGroup

        group_id = options["group"]
        try:
            group = selectors.group_get(group_id=group_id)
        except FabricGroup.DoesNotExist:
            known = ", ".join(g.group_id for g in selectors.group_list()) or "none; run manage.py seed_demo"
            raise CommandError(f"no fabric group {group_id!r} (known groups: {known})") from None
        if not selectors.group_pools(group=group).filter(enabled=True).exists():
            raise CommandError(f"fabric group {group_id!r} has no enabled pools")
        try:
            settings = dispatcher_settings(
                group_id,
                concurrency=options["concurrency"],
                dispatcher_id=options["dispatcher_id"],
                gateway_id=options["gateway_id"],
                shutdown_grace_s=options["grace"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not options["no_publish"]:
            result = services.group_publish(group=group)
            if not result.ok:
                log.warning(
                    "could not publish group %s at start (%s); waiting for Valkey", group_id, result.error
                )
        eventloop.run(self._run(settings, guard=not options["no_publish"]))

    async def _run(self, settings: DispatcherSettings, *, guard: bool) -> None:
        client = connect(
            valkey_url(), max_connections=max(16, settings.concurrency + 8), health_s=settings.valkey_health_s
        )
        tracing = _start_tracing()
        try:
            dispatcher = OperatorDispatcher(
                client,
                settings,
                keys=key_space(),
                secrets=os.environ,
                snapshot_sink=_snapshot_sink(),
                store_content=_store_content(),
            )
            collector = gc_tuning.tune_for_service()  # after the imports and set-up: they stay frozen
            self.stdout.write(
                f"dispatcher {settings.dispatcher_id} (gateway {settings.gateway_id}) "
                f"serving fabric group {settings.group_id} on {eventloop.loop_name()}, {collector}"
            )
            stop = asyncio.Event()
            by = f"dispatcher {settings.dispatcher_id}"
            watching = asyncio.create_task(ConfigGuard(settings.group_id, by=by).run(stop)) if guard else None
            try:
                await dispatcher.run()
            finally:
                stop.set()
                if watching is not None:
                    await watching
            self.stdout.write(f"dispatcher {settings.dispatcher_id} stopped: {dispatcher!r}")
        finally:
            await client.aclose()
            tracing()


def _snapshot_sink() -> Any:
    try:
        from dashboard.publisher import snapshot_sink
    except ImportError:
        return None
    return snapshot_sink()


def _store_content() -> bool:
    return bool(django_settings.HISTORY_STORE_CONTENT)


def _start_tracing() -> Any:
    """Installs the span exporter to the Valkey stream; returns its shutdown callable."""
    return start_tracing("llm-dispatch-dispatcher")
