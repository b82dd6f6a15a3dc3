"""``manage.py whatif``: a group's recorded traffic replayed under a changed configuration."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from history.client import HistoryUnavailable
from pools import selectors
from pools.models import FabricGroup
from pools.whatif import DEFAULT_MINUTES, MAX_MINUTES, group_whatif
from runtime.whatif.changes import BadChange
from runtime.whatif.compare import WhatIf, format_table
from runtime.whatif.trace import TraceTooLarge


class Command(BaseCommand):
    help = (
        "Replay a fabric group's recorded traffic through the scheduler under the saved configuration "
        "and under changed settings, and print predicted queue waits per pool side by side."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--group", required=True, help="fabric group id")
        parser.add_argument(
            "--minutes",
            type=float,
            default=DEFAULT_MINUTES,
            help=f"recorded minutes to replay, at most {MAX_MINUTES} (default: %(default)s)",
        )
        parser.add_argument(
            "--set",
            action="append",
            default=[],
            dest="changes",
            metavar="NAME.FIELD=VALUE",
            help="a change, e.g. backfill.weight=2, interactive.max_concurrent=16, "
            "group.total_concurrency=24, backend.sim.max_in_flight=8 (repeatable)",
        )
        parser.add_argument(
            "--until", type=float, default=None, help="end of the window, Unix seconds (default: now)"
        )
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 0 < options["minutes"] <= MAX_MINUTES:
            raise CommandError(f"--minutes must be between 0 and {MAX_MINUTES}")
        try:
            group = selectors.group_get(group_id=options["group"])
        except FabricGroup.DoesNotExist as exc:
            raise CommandError(f"no fabric group {options['group']!r}") from exc
        until = datetime.fromtimestamp(options["until"], tz=UTC) if options["until"] else None
        try:
            result = group_whatif(
                group=group, minutes=options["minutes"], changes=options["changes"], until=until
            )
        except BadChange as exc:
            raise CommandError(f"bad --set: {exc}") from exc
        except (TraceTooLarge, HistoryUnavailable) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(as_json(result), indent=2) if options["json"] else format_table(result))


def as_json(result: WhatIf) -> dict[str, Any]:
    """The table's numbers, keyed by pool, for scripts (the benchmark reads it)."""
    pools: dict[str, Any] = {}
    for pid, cur, prop, rec in result.rows():
        entry: dict[str, Any] = {}
        if rec is not None:
            entry["recorded"] = {"wait": _levels(rec.wait), "arrivals": rec.arrivals, "refused": rec.refused}
        for side, outcome in (("current", cur), ("proposed", prop)):
            if outcome is not None:
                entry[side] = {
                    "wait": _levels(outcome.wait),
                    "throughput_per_s": outcome.throughput_per_s,
                    "peak_depth": outcome.peak_depth,
                    "refused": outcome.refused,
                    "unserved": outcome.unserved,
                    "launched": outcome.launched,
                }
        pools[pid] = entry
    return {
        "requests": len(result.trace),
        "window_s": result.trace.end - result.trace.start,
        "pools": pools,
        "fits": result.model_lines(),
    }


def _levels(wait: dict[float, float | None]) -> dict[str, float | None]:
    return {f"p{round(level * 100)}": value for level, value in wait.items()}
