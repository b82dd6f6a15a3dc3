"""Republishes every fabric group's configuration to Valkey (after an outage, or a restore)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pools import selectors, services


class Command(BaseCommand):
    help = "Publish fabric group configurations to Valkey so running dispatchers pick them up."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("group_ids", nargs="*", help="groups to publish (default: all)")
        parser.add_argument(
            "--no-prune",
            action="store_true",
            help="keep registry entries of groups that no longer exist (pruned by default with no ids)",
        )

    def handle(self, *args: Any, group_ids: list[str], no_prune: bool, **options: Any) -> None:
        if group_ids:
            missing = sorted(set(group_ids) - set(selectors.group_list().values_list("group_id", flat=True)))
            if missing:
                raise CommandError(f"unknown fabric group(s): {', '.join(missing)}")
            results = services.group_publish_many(group_ids=group_ids)
        else:
            results = services.group_publish_all(prune=not no_prune)
        for result in results:
            if result.ok and result.unpublished:
                self.stdout.write(f"removed {result.group_id}: the group no longer exists")
            elif result.ok:
                self.stdout.write(
                    f"published {result.group_id}: version {result.version}, {result.pools} pools"
                )
        failed = [r for r in results if not r.ok]
        if failed:
            raise CommandError("; ".join(f"{r.group_id}: {r.error}" for r in failed))
        if not results:
            self.stdout.write("no fabric groups to publish")
