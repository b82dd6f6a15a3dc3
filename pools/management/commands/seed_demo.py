"""Creates the demo fabric group and its pools (idempotent), then publishes it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from pools import services
from pools.models import Backend, FabricGroup, Pool

DEMO_GROUP = "demo"
DEMO_BACKEND = "sim"
DEFAULT_ENDPOINT = "http://127.0.0.1:8100/v1"
DEMO_TOTAL = 16
# Backfill's queue is bounded: past this many waiting, its submits are refused (QueueFull) and counted.
DEMO_BACKFILL_MAX_QUEUED = 200
DEMO_POOLS: tuple[dict[str, Any], ...] = (
    {"pool_id": "interactive", "display_name": "Interactive", "quantum": 4, "min_concurrent": 4,
     "max_concurrent": 12, "max_burst_per_visit": 4},
    {"pool_id": "document-extract", "display_name": "Document extraction", "quantum": 2, "min_concurrent": 0,
     "max_concurrent": 8, "max_burst_per_visit": 2},
    {"pool_id": "backfill", "display_name": "Backfill", "quantum": 1, "min_concurrent": 0,
     "max_concurrent": 8, "max_burst_per_visit": 1, "max_queued": DEMO_BACKFILL_MAX_QUEUED},
    {"pool_id": "default", "display_name": "Default", "quantum": 1, "min_concurrent": 0,
     "max_concurrent": 8, "max_burst_per_visit": 1},
)  # fmt: skip


class Command(BaseCommand):
    help = (
        "Create the demo backend 'sim' (the simulator, vLLM metrics) and the demo fabric group 'demo' (DRR) "
        "with pools interactive, document-extract, backfill (max_queued "
        f"{DEMO_BACKFILL_MAX_QUEUED}) and default, then publish it. Existing rows are left as the operator "
        "edited them unless --reset."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--endpoint",
            default=None,
            help="the demo backend's base URL, set even on existing rows "
            f"(default: {DEFAULT_ENDPOINT} for a new backend)",
        )
        parser.add_argument(
            "--reset",
            action="store_true",
            help="restore the demo values of existing rows, undoing admin edits (kept by default)",
        )
        parser.add_argument(
            "--admin-password",
            default=None,
            help="also create (or reset) the superuser 'admin' with this password -- demo installs only",
        )

    def handle(
        self, *args: Any, endpoint: str | None, reset: bool, admin_password: str | None, **options: Any
    ) -> None:
        with transaction.atomic():
            backend = self._backend(endpoint, reset)
            group = self._group(backend, reset)
            for order, values in enumerate(DEMO_POOLS):
                self._pool(group, {**values, "sort_order": order}, reset)
        if admin_password:
            self._admin(admin_password)
        [result] = services.group_publish_many(group_ids=[group.group_id])
        if not result.ok:
            raise CommandError(
                f"demo group saved, but not published: {result.error}. Run `manage.py pools_publish` "
                "once Valkey is reachable."
            )
        self.stdout.write(f"demo group published: version {result.version}, {result.pools} pools")

    def _backend(self, endpoint: str | None, reset: bool) -> Backend:
        fresh = Backend(backend_id=DEMO_BACKEND, name="Simulator (vLLM-like)", kind=Backend.Kind.VLLM)
        backend = Backend.objects.filter(backend_id=DEMO_BACKEND).first()
        if backend is None:
            backend = fresh
        elif reset:
            for field in Backend._meta.concrete_fields:
                if field.name not in ("backend_id", "updated_at"):
                    setattr(backend, field.attname, getattr(fresh, field.attname))
        elif not endpoint:
            return backend
        backend.base_url = endpoint or (
            backend.base_url if backend.base_url and not reset else DEFAULT_ENDPOINT
        )
        self._save(lambda: services.backend_save(backend=backend))
        return backend

    def _group(self, backend: Backend, reset: bool) -> FabricGroup:
        defaults = {
            "name": "Demo",
            "policy": FabricGroup.Policy.DRR,
            "total_concurrency": DEMO_TOTAL,
            "queueing_enabled": True,
            "backend": backend,
        }
        group = FabricGroup.objects.filter(group_id=DEMO_GROUP).first()
        if group is None:
            group = FabricGroup(group_id=DEMO_GROUP, **defaults)
        elif reset:
            for name, value in defaults.items():
                setattr(group, name, value)
        elif group.backend_id is None:
            group.backend = backend
        else:
            return group
        group.skip_group_check = True  # pools are checked below, once they exist
        self._save(lambda: services.group_save(group=group, publish=False))
        return group

    def _pool(self, group: FabricGroup, values: dict[str, Any], reset: bool) -> None:
        pool = Pool.objects.filter(pool_id=values["pool_id"]).first()
        if pool is not None and not reset:
            return
        pool = pool or Pool(pool_id=values["pool_id"])
        pool.group = group
        for name, value in {"max_queued": None, "max_queue_wait_s": None, **values}.items():
            setattr(pool, name, value)
        pool.enabled, pool.paused, pool.backend = True, False, None
        self._save(lambda: services.pool_save(pool=pool, publish=False))

    def _save(self, save: Any) -> None:
        try:
            save()
        except ValidationError as exc:
            raise CommandError(f"demo data refused: {'; '.join(exc.messages)}") from exc

    def _admin(self, password: str) -> None:
        user_model = get_user_model()
        user = user_model.objects.filter(username="admin").first() or user_model(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write("superuser 'admin' ready (demo only: change its password for anything else)")
