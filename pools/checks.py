"""System checks of the configured fabric groups (``manage.py check``), with stable ids and hints.

dispatch.E001  a group's configuration is refused by the scheduler (e.g. protected slots over the total)
dispatch.E002  an enabled pool has no backend: neither its own nor its group's default
dispatch.E003  ``VALKEY_URL`` is not a form the project reads (runtime.valkey.url)
dispatch.W001  a backend's ``api_key_env`` names an environment variable that is not set here
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DatabaseError

from pools import selectors
from pools.models import FabricGroup
from pools.validation import group_problems, pool_values
from runtime.valkey.url import InvalidValkeyUrl, parse_sentinel

TAG = "dispatch"


def check_valkey_url(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A mistyped ``VALKEY_URL`` is named at start-up, not at the first view that reads Valkey."""
    try:
        parse_sentinel(str(settings.VALKEY_URL)) if settings.VALKEY_URL else None
    except InvalidValkeyUrl as exc:
        return [
            checks.Error(
                str(exc),
                hint="redis://[:password@]host:port/db, or valkey+sentinel://[:password@]host1:26379,"
                "host2:26379/MASTER_NAME/db for a primary behind Sentinel (README, docs/deploy.md)",
                id="dispatch.E003",
            )
        ]
    return []


def check_fabric_groups(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        groups = list(selectors.group_list().prefetch_related("pools"))
        backends = list(selectors.backend_list())
    except DatabaseError:
        return []  # not migrated yet (e.g. during `migrate` itself): nothing configured to check
    found: list[checks.CheckMessage] = []
    for group in groups:
        found.extend(_group_messages(group))
    for backend in backends:
        if backend.api_key_env and backend.api_key_env not in os.environ:
            found.append(
                checks.Warning(
                    f"Backend {backend.backend_id!r} reads its API key from ${backend.api_key_env}, "
                    "which is not set in this environment.",
                    hint=f"Export {backend.api_key_env} for the dispatchers that call it, or clear the "
                    "field if the backend needs no key.",
                    obj=backend,
                    id="dispatch.W001",
                )
            )
    return found


def _group_messages(group: FabricGroup) -> list[checks.CheckMessage]:
    pools = list(group.pools.all())
    messages: list[checks.CheckMessage] = []
    values = [pool_values(p) for p in pools]
    for problem in group_problems(
        policy=group.policy, total_concurrency=group.total_concurrency, pools=values
    ):
        messages.append(
            checks.Error(
                f"Fabric group {group.group_id!r}: {problem}.",
                hint="Fix it in the admin (Pools > Fabric groups): lower the pools' min concurrent or raise "
                "the group's total concurrency; dispatchers keep the last valid configuration until then.",
                obj=group,
                id="dispatch.E001",
            )
        )
    if group.backend_id is None:
        for pool in pools:
            if pool.enabled and pool.backend_id is None:
                messages.append(
                    checks.Error(
                        f"Pool {pool.pool_id!r} of fabric group {group.group_id!r} has no backend.",
                        hint="Set the group's default backend or the pool's own backend.",
                        obj=pool,
                        id="dispatch.E002",
                    )
                )
    return messages
