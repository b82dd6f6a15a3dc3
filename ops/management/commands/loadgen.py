"""``manage.py loadgen``: keep interactive, document-extract and backfill traffic flowing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ops.loadgen import DEMO_LANES, LoadStats, run_lane
from ops.runtime_settings import producer_settings
from pools.connections import key_space, valkey_url
from runtime.producer import Producer
from runtime.valkey.client import connect


class Command(BaseCommand):
    help = "Generate demo traffic into the demo group's pools, printing live counts every few seconds."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--duration",
            type=float,
            default=0,
            help="seconds to run, 0 = until Ctrl-C (default: %(default)s)",
        )
        parser.add_argument(
            "--scale",
            type=float,
            default=1.0,
            help="multiply every lane's arrival rate (default: %(default)s)",
        )
        parser.add_argument(
            "--max-outstanding",
            type=int,
            default=2000,
            help="most unanswered requests per lane before it waits (default: %(default)s)",
        )
        parser.add_argument(
            "--print-every",
            type=float,
            default=5.0,
            help="seconds between count lines (default: %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["scale"] <= 0:
            raise CommandError("--scale must be positive")
        lanes = [replace(lane, rate_per_s=lane.rate_per_s * options["scale"]) for lane in DEMO_LANES]
        duration = options["duration"] or 10 * 365 * 86400.0
        asyncio.run(self._run(lanes, duration, options["max_outstanding"], options["print_every"]))

    async def _run(self, lanes: list, duration: float, max_outstanding: int, print_every: float) -> None:
        from runtime.telemetry.tracing import configure_tracing, otlp_configured, shutdown_tracing

        provider = configure_tracing(
            redis_url=valkey_url(),
            keys=key_space(),
            service_name="llm-dispatch-producer",
            otlp=otlp_configured(os.environ),
        )
        producer_config = producer_settings()
        client = connect(valkey_url(), max_connections=32, health_s=producer_config.valkey_health_s)
        stats = LoadStats()
        until = time.monotonic() + duration
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            async with Producer(
                client, keys=key_space(), settings=producer_config, secrets=os.environ
            ) as producer:
                tasks = [
                    asyncio.create_task(
                        run_lane(producer, lane, stats, until=until, max_outstanding=max_outstanding, seed=i)
                    )
                    for i, lane in enumerate(lanes)
                ]
                while not stop.is_set() and not all(t.done() for t in tasks):
                    try:
                        await asyncio.wait_for(stop.wait(), print_every)
                    except TimeoutError:
                        self.stdout.write(f"[loadgen] {stats.line()}")
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            self.stdout.write(f"[loadgen] final: {stats.line()}")
        finally:
            await client.aclose()
            shutdown_tracing(provider, 5.0)
