"""Creates the ClickHouse history table (idempotent) and applies the retention TTL."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from history import schema
from history.client import HistoryUnavailable, history_client


class Command(BaseCommand):
    help = "Create the ClickHouse history table (otel_traces layout) if missing and apply the TTL."

    def handle(self, *args: Any, **options: Any) -> None:
        client = history_client()
        try:
            schema.migrate(client, retention_days=int(settings.HISTORY_RETENTION_DAYS))
        except HistoryUnavailable as exc:
            raise CommandError(str(exc)) from exc
        except ValueError as exc:
            raise CommandError(f"HISTORY_RETENTION_DAYS: {exc}") from exc
        self.stdout.write(
            f"history table {schema.table_name(client)} ready "
            f"(retention {settings.HISTORY_RETENTION_DAYS} days)"
        )
