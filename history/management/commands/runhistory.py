"""Runs the history ingester (span stream -> ClickHouse) in the foreground until SIGTERM/SIGINT."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from history.ingester import DEFAULT_BATCH_SIZE, build_from_settings


class Command(BaseCommand):
    help = "Read spans from the Valkey span stream and batch-insert them into ClickHouse."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--consumer", help="consumer name in the 'history' group (default: per host)")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help="most spans read and inserted into ClickHouse at once (default: %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        kwargs: dict[str, Any] = {"batch_size": options["batch_size"]}
        if options.get("consumer"):
            kwargs["consumer"] = options["consumer"]
        try:
            ingester = build_from_settings(**kwargs)
        except Exception as exc:
            raise CommandError(f"cannot start the history ingester: {exc}") from exc
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        self.stdout.write(f"history ingester running: {ingester!r}")
        self.stdout.flush()
        ingester.run(stop)
        self.stdout.write(f"history ingester stopped: {ingester!r}")
