"""The pure merge of a fabric group's dispatcher snapshots into one view (no I/O, no clock).

Every dispatcher keeps its latest snapshot in Valkey with a short TTL; the set of live snapshots of a
group *is* the set of running dispatchers. :func:`merge_snapshots` takes snapshots and ``now`` and
returns the view, so the dashboard page, the websocket consumer and ``/metrics`` all show the same
figures. :func:`finish_view` adds what snapshots do not carry (configured pools, counters, backends).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NotRequired, TypedDict

from runtime.dispatch.snapshot import DispatcherSnapshot
from runtime.queue.keys import SNAPSHOT_TTL_S

# The dispatcher publishes at least every 2 s; older than this and the feed is shown as stale.
STALE_AFTER_S = 5.0
VIEW_SCHEMA = 1


class ConfiguredPool(TypedDict):
    """A pool as configured in the database (``dashboard.selectors.configured_pools``), with its links."""

    pool_id: str
    display_name: str
    weight: int
    min_concurrent: int
    max_concurrent: int
    max_burst_per_visit: int
    enabled: bool
    paused: bool
    max_queued: int | None
    tenant_fairness: NotRequired[str]  # off | requests | tokens (issue 22)
    admin_url: str
    dead_letters_url: str


class TenantRow(TypedDict):
    """One tenant of a fair pool on the dashboard (``dashboard.selectors.tenants_read``)."""

    tenant: str  # "*": untagged traffic
    queued: int
    in_flight: int
    counter: float | None  # the virtual counter; None: forgotten (idle, nothing queued)
    served: float  # cumulative cost served (before the tenant's weight)
    served_last_minute: float | None  # None: no earlier read of it in this web process yet


class PoolTenants(TypedDict):
    """A fair pool's top tenants: backlogged = tenants with queued work (ZCARD of the pool's zset)."""

    pool_id: str
    fairness: str
    backlogged: int
    rows: list[TenantRow]


class FabricView(TypedDict):
    """The merged live view of one fabric group: what the page, the websocket and ``/metrics`` show.

    Pools, dispatcher rows and active requests stay open dicts: the page adds its own display fields.
    """

    schema: int
    group_id: str | None
    now: float
    at: float | None
    age_s: float | None
    stale: bool
    dispatchers_running: int
    policy: str | None
    config_version: int | None
    total_concurrency: int | None
    group_in_flight: int
    in_flight: int
    queued: int
    completed: int
    failed: dict[str, int]
    dropped: dict[str, int]
    pools: list[dict[str, Any]]
    dispatchers: list[dict[str, Any]]
    active: list[dict[str, Any]]
    # What snapshots do not carry, added by finish_view (and fabric_view's valkey_error).
    valkey_error: NotRequired[str]
    backends: NotRequired[list[dict[str, Any]]]
    totals: NotRequired[dict[str, Any]]
    live_queue_depth: NotRequired[dict[str, int]]
    dead_letters: NotRequired[list[dict[str, Any]]]
    dead_letters_total: NotRequired[int]
    tenant_pools: NotRequired[list[PoolTenants]]


def live_snapshots(
    snapshots: Iterable[DispatcherSnapshot], *, now: float, ttl_s: float = SNAPSHOT_TTL_S
) -> dict[str, DispatcherSnapshot]:
    """The latest snapshot per dispatcher, without those whose TTL has lapsed.

    Fields are read with defaults: a snapshot comes over the network, maybe from an older dispatcher.
    """
    latest: dict[str, DispatcherSnapshot] = {}
    for snap in snapshots:
        dispatcher_id = str(snap.get("dispatcher_id", ""))
        if now - float(snap.get("at", 0)) > ttl_s:
            continue
        known = latest.get(dispatcher_id)
        if known is None or float(snap.get("at", 0)) >= float(known.get("at", 0)):
            latest[dispatcher_id] = snap.copy()
    return latest


def _sum_counts(target: Counter[str], counts: Mapping[str, Any] | None) -> None:
    for name, value in (counts or {}).items():
        target[name] += int(value)


# Per-pool counts each dispatcher keeps for itself: the group's figure is their sum.
PER_DISPATCHER_COUNTS: tuple[Literal["lost_in_flight"], ...] = ("lost_in_flight",)


def _merge_pools(ordered: list[DispatcherSnapshot]) -> list[dict[str, Any]]:
    """Per pool: shared figures from the freshest snapshot, per-dispatcher figures summed or listed."""
    pools: dict[str, dict[str, Any]] = {}
    for snap in ordered:  # freshest first
        dispatcher_id = str(snap.get("dispatcher_id", ""))
        for pool in snap.get("pools", []):
            pool_id = pool["pool_id"]
            merged = pools.get(pool_id)
            if merged is None:
                merged = {
                    k: v
                    for k, v in pool.items()
                    if k not in ("skips", "in_flight_local", "deficit", "launched", "cost_dispatched")
                    and k not in PER_DISPATCHER_COUNTS
                }
                merged.update(skips=Counter(), in_flight_local=0, deficit={}, launched=0, cost_dispatched=0)
                merged.update(dict.fromkeys(PER_DISPATCHER_COUNTS, 0))
                pools[pool_id] = merged
            for name in PER_DISPATCHER_COUNTS:
                merged[name] += int(pool.get(name, 0))
            _sum_counts(merged["skips"], pool.get("skips"))
            merged["in_flight_local"] += int(pool.get("in_flight_local", 0))
            merged["launched"] += int(pool.get("launched", 0))
            merged["cost_dispatched"] += int(pool.get("cost_dispatched", 0))
            merged["deficit"][dispatcher_id] = pool.get("deficit", 0)
    result = []
    for merged in pools.values():
        merged["skips"] = dict(sorted(merged["skips"].items()))
        merged["skips_total"] = sum(merged["skips"].values())
        result.append(merged)
    return result


def _dispatcher_row(snap: DispatcherSnapshot, now: float) -> dict[str, Any]:
    age_s = max(0.0, now - float(snap.get("at", 0)))
    return {
        "dispatcher_id": snap.get("dispatcher_id", ""),
        "gateway_id": snap.get("gateway_id", ""),
        "up_since": snap.get("up_since"),
        "uptime_s": round(max(0.0, now - float(snap.get("up_since") or now)), 1),
        # Snapshots travel through Valkey, so a dispatcher cut off from it cannot say so: its last word
        # stays "ok". One not heard from for longer than a few heartbeats cannot vouch for its link.
        "valkey_ok": bool(snap.get("valkey_ok", False)) and age_s <= STALE_AFTER_S,
        # Which Valkey (host:port; after a failover the new primary) and since when: older
        # dispatchers' snapshots have neither.
        "valkey": str(snap.get("valkey") or ""),
        "valkey_reconnected_at": snap.get("valkey_reconnected_at"),
        "breakers": dict(snap.get("breakers") or {}),
        "stopping": bool(snap.get("stopping", False)),
        "in_flight": int(snap.get("in_flight", 0)),
        "concurrency": snap.get("concurrency"),
        "completed": int(snap.get("completed", 0)),
        "failed": dict(snap.get("failed") or {}),
        "failed_total": sum(int(v) for v in (snap.get("failed") or {}).values()),
        "dropped": dict(snap.get("dropped") or {}),
        "internal_errors": int(snap.get("internal_errors", 0)),
        "config_rejected": int(snap.get("config_rejected", 0)),
        "config_version": snap.get("config_version"),
        "at": snap.get("at"),
        "age_s": round(age_s, 1),
    }


def merge_snapshots(
    snapshots: Iterable[DispatcherSnapshot], *, now: float, stale_after_s: float = STALE_AFTER_S
) -> FabricView:
    """One view of a fabric group from the snapshots of its dispatchers (expired ones are ignored)."""
    live = live_snapshots(snapshots, now=now)
    ordered = sorted(live.values(), key=lambda s: float(s.get("at", 0)), reverse=True)
    freshest: Mapping[str, Any] = ordered[0] if ordered else {}
    failed: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    active: list[dict[str, Any]] = []
    for snap in ordered:
        _sum_counts(failed, snap.get("failed"))
        _sum_counts(dropped, snap.get("dropped"))
        for item in snap.get("active", []):
            active.append(
                {**item, "dispatcher_id": snap.get("dispatcher_id"), "gateway_id": snap.get("gateway_id")}
            )
    active.sort(key=lambda a: -float(a.get("age_s") or 0))
    age = round(max(0.0, now - float(freshest["at"])), 1) if freshest else None
    pools = _merge_pools(ordered)
    return {
        "schema": VIEW_SCHEMA,
        "group_id": freshest.get("group_id"),
        "now": round(now, 3),
        "at": freshest.get("at"),
        "age_s": age,
        "stale": age is None or age > stale_after_s,
        "dispatchers_running": len(ordered),
        "policy": freshest.get("policy"),
        "config_version": freshest.get("config_version"),
        "total_concurrency": freshest.get("total_concurrency"),
        "group_in_flight": int(freshest.get("group_in_flight", 0)),
        "in_flight": sum(int(s.get("in_flight", 0)) for s in ordered),
        "queued": sum(int(p.get("queue_depth") or 0) for p in pools),
        "completed": sum(int(s.get("completed", 0)) for s in ordered),
        "failed": dict(sorted(failed.items())),
        "dropped": dict(sorted(dropped.items())),
        "pools": pools,
        "dispatchers": [_dispatcher_row(s, now) for s in sorted(ordered, key=lambda s: s["dispatcher_id"])],
        "active": active,
    }


def with_configured_pools(
    view: FabricView, *, pools: list[ConfiguredPool], queue_lengths: Mapping[str, int]
) -> FabricView:
    """Adds configured pools no live snapshot reports (no dispatcher running, disabled pools).

    Their queue depth is the live LLEN; in-flight and credit are unknown without a dispatcher.
    """
    known = {p["pool_id"] for p in view["pools"]}
    extra = []
    for pool in pools:
        if pool["pool_id"] in known:
            continue
        extra.append(
            {
                **pool,
                "queue_depth": int(queue_lengths.get(pool["pool_id"], 0)),
                "in_flight": None,
                "in_flight_local": 0,
                "oldest_pending_age_s": None,
                "head_cost": None,
                "deficit": {},
                "skips": {},
                "skips_total": 0,
                "launched": 0,
                "cost_dispatched": 0,
                "unobserved": True,
            }
        )
    if not extra:
        return view
    merged = [*view["pools"], *extra]
    order = {p["pool_id"]: i for i, p in enumerate(pools)}
    merged.sort(key=lambda p: order.get(p["pool_id"], len(order)))
    result = view.copy()
    result["pools"] = merged
    result["queued"] = sum(int(p.get("queue_depth") or 0) for p in merged)
    return result


# Counters without a detail part; those past the first two appear only once a dispatcher counted one.
# retried/requeued/dead_lettered: durable delivery and retries (redelivery outcomes of an attempt).
REDELIVERY_COUNTERS = ("retried", "requeued", "dead_lettered")
PLAIN_COUNTERS = ("completed", "valkey_outages", "internal_error", "config_rejected", *REDELIVERY_COUNTERS)


def counter_totals(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """The group's cumulative counter hash (``completed``, ``failed:<type>``, ``dropped:<reason>``)."""
    totals: dict[str, Any] = {
        "completed": 0, "failed": {}, "dropped": {}, "unpersisted": {}, "valkey_outages": 0
    }  # fmt: skip
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        count = int(value)
        kind, _, detail = name.partition(":")
        if kind in ("failed", "dropped", "unpersisted") and detail:
            totals[kind][detail] = count
        elif kind in PLAIN_COUNTERS:
            totals[kind] = count
    totals["failed"] = dict(sorted(totals["failed"].items()))
    totals["dropped"] = dict(sorted(totals["dropped"].items()))
    totals["failed_total"] = sum(totals["failed"].values())
    totals["dropped_total"] = sum(totals["dropped"].values())
    return totals


def rejections_by_pool(raw: Mapping[Any, Any]) -> dict[str, dict[str, int]]:
    """The rejections hash (``{pool_id}:{reason}`` -> count) as pool -> reason -> count."""
    found: dict[str, dict[str, int]] = {}
    for key, value in raw.items():
        text = key.decode() if isinstance(key, bytes) else str(key)
        pool_id, _, reason = text.rpartition(":")
        if pool_id:
            found.setdefault(pool_id, {})[reason] = int(value)
    return found


def finish_view(
    view: FabricView,
    *,
    group_id: str,
    configured: list[ConfiguredPool],
    queue_lengths: Mapping[str, int],
    totals: dict[str, Any],
    backends: list[dict[str, Any]] | None = None,
    rejections: Mapping[str, Mapping[str, int]] | None = None,
    now: float,
) -> FabricView:
    """Adds what snapshots do not carry: unobserved pools, links, the group's cumulative counters,
    the backends' live status, the submits refused per pool and the fair pools' top tenants."""
    view = with_configured_pools(view, pools=configured, queue_lengths=queue_lengths)
    links = {p["pool_id"]: p.get("admin_url", "") for p in configured}
    limits = {p["pool_id"]: p.get("max_queued") for p in configured}
    rejections = rejections or {}
    for pool in view["pools"]:
        pool["admin_url"] = links.get(pool["pool_id"], "")
        pool["max_queued"] = limits.get(pool["pool_id"])
        pool["rejected"] = dict(rejections.get(pool["pool_id"], {}))
    view["backends"] = list(backends or [])
    view["group_id"] = group_id
    # The fair pools' tenants ride in totals from the read; the view carries them once, by pool.
    tenants: Mapping[str, PoolTenants] = totals.get("tenants") or {}
    view["totals"] = {k: v for k, v in totals.items() if k != "tenants"}
    view["tenant_pools"] = [tenants[p["pool_id"]] for p in configured if p["pool_id"] in tenants]
    view["live_queue_depth"] = dict(queue_lengths)
    view["dead_letters"] = dead_letter_rows(totals.get("dead_letters", {}), configured, now=now)
    view["dead_letters_total"] = sum(row["count"] for row in view["dead_letters"])
    view["config_restored"] = totals.get("config_restored")
    return view


def dead_letter_rows(
    summaries: Mapping[str, Mapping[str, Any]], configured: list[ConfiguredPool], *, now: float
) -> list[dict[str, Any]]:
    """Pools with dead letters: how many, how old the oldest is, and where an operator acts on them."""
    links = {p["pool_id"]: p.get("dead_letters_url", "") for p in configured}
    rows = []
    for pool_id, summary in summaries.items():
        if not summary["count"]:
            continue
        oldest = summary["oldest_dead_at"]
        rows.append(
            {
                "pool_id": pool_id,
                "count": summary["count"],
                "oldest_age_s": None if oldest is None else max(0.0, now - oldest),
                "url": links.get(pool_id, ""),
            }
        )
    return rows
