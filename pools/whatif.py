"""What-if for a fabric group: its recorded traffic replayed under the saved and an edited configuration.

The one place the admin's What-if panel and ``manage.py whatif`` meet: the configuration in force is
the group's saved one (what :func:`pools.services.group_publish` sends its dispatchers), the proposed
one is that with ``pool.field=value`` changes applied (:mod:`runtime.whatif.changes`), the traffic is
the group's last ``minutes`` in history. Raises ``BadChange`` for a change the replay cannot apply,
``TraceTooLarge`` for a window over the replay's bound, ``HistoryUnavailable`` when ClickHouse cannot be
read. The replay is CPU work of a second or two: callers run it outside any event loop (Django runs
the admin's synchronous views in a worker thread under ASGI).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from history.client import history_client
from history.whatif import MAX_WINDOW, whatif_trace
from ingress.selectors import tenant_weights
from pools import selectors
from pools.models import FabricGroup
from runtime.whatif.changes import apply_changes
from runtime.whatif.compare import WhatIf, what_if

__all__ = ["DEFAULT_MINUTES", "MAX_MINUTES", "group_whatif"]

DEFAULT_MINUTES = 60
MAX_MINUTES = int(MAX_WINDOW.total_seconds() // 60)


def group_whatif(
    *, group: FabricGroup, minutes: float, changes: Sequence[str], until: datetime | None = None
) -> WhatIf:
    """The group's last ``minutes`` (clamped to 1 .. 24 h) replayed under both configurations."""
    current = selectors.group_config(group=group)
    proposed = apply_changes(current, changes)
    minutes = min(max(float(minutes), 1.0), MAX_MINUTES)
    until = until or datetime.fromtimestamp(time.time(), tz=UTC)
    trace = whatif_trace(
        client=history_client(),
        group=group.group_id,
        pool_ids=[p.pool_id for p in current.pools],
        since=until - timedelta(minutes=minutes),
        until=until,
    )
    return what_if(trace, current, proposed, tenant_weights=tenant_weights(tenants=trace.tenants))
