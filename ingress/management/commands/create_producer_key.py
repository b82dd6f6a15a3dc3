"""Creates a producer key for the ingress and prints it alone on the last line (for scripts)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ingress import services
from pools.models import Pool


class Command(BaseCommand):
    # A key does not depend on the fabric being healthy: create it even while a check fails.
    requires_system_checks: list[str] = []
    help = "Create an ingress API key NAME allowed into --pools; the key is printed once, on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the key's name, recorded as the producer label in history")
        parser.add_argument("--pools", required=True, help="comma-separated pool ids the key may use")
        parser.add_argument(
            "--default-pool", default=None, help="pool without X-Dispatch-Pool (default: first)"
        )
        parser.add_argument(
            "--no-default-pool",
            action="store_true",
            help="no default pool: every request names its pool (X-Dispatch-Pool) or a model alias",
        )
        parser.add_argument("--max-in-flight", type=int, default=None)
        parser.add_argument("--max-queued", type=int, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        pools = [p.strip() for p in options["pools"].split(",") if p.strip()]
        known = set(Pool.objects.filter(pool_id__in=pools).values_list("pool_id", flat=True))
        if unknown := [p for p in pools if p not in known]:
            raise CommandError(f"unknown pool(s): {', '.join(unknown)} (create them in the admin first)")
        try:
            created = services.producer_key_create(
                name=options["name"],
                pools=pools,
                default_pool="" if options["no_default_pool"] else options["default_pool"],
                max_in_flight=options["max_in_flight"],
                max_queued=options["max_queued"],
            )
        except ValidationError as exc:
            problems = "; ".join(f"{field}: {' '.join(errs)}" for field, errs in exc.message_dict.items())
            raise CommandError(f"cannot create key {options['name']!r}: {problems}") from exc
        self.stdout.write(
            f"Created producer key {created.key.name!r} for pools {', '.join(pools)}; "
            "it is shown once, on the next line:"
        )
        self.stdout.write(created.raw_key)
