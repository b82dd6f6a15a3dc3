"""Reads of the live fabric state: dispatcher snapshots and counters in Valkey, merged into one view.

Every dispatcher keeps its latest snapshot in Valkey with a short TTL; the set of live snapshot keys of
a group *is* the set of running dispatchers. :func:`merge_snapshots` is pure (snapshots and ``now`` in,
view out) so the dashboard page, the websocket consumer and ``/metrics`` all show the same figures.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

import orjson
import redis

from pools.connections import VALKEY_ERRORS, key_space, sync_client
from runtime.backends.status import queue_reads, status_from_replies
from runtime.dispatch import deadletters
from runtime.dispatch.stats import (
    DROP_DUPLICATE,
    DROP_EXPIRED,
    DROP_LOST_IN_FLIGHT,
    DROP_MALFORMED,
    DROP_PRODUCER_GONE,
    DROP_REASONS,
    DROP_REPLY_PRODUCER_GONE,
    DROP_REPLY_UNDELIVERED,
)
from runtime.errors import DispatchError
from runtime.queue.keys import SNAPSHOT_TTL_S
from runtime.wire.groupconfig import GroupConfig

log = logging.getLogger(__name__)

# The dispatcher publishes at least every 2 s; older than this and the feed is shown as stale.
STALE_AFTER_S = 5.0
VIEW_SCHEMA = 1
_SCAN_COUNT = 200


# --- pure merge ------------------------------------------------------------------------------------
def live_snapshots(
    snapshots: Iterable[Mapping[str, Any]], *, now: float, ttl_s: float = SNAPSHOT_TTL_S
) -> dict[str, dict[str, Any]]:
    """The latest snapshot per dispatcher, without those whose TTL has lapsed."""
    latest: dict[str, dict[str, Any]] = {}
    for snap in snapshots:
        dispatcher_id = str(snap.get("dispatcher_id", ""))
        if now - float(snap.get("at", 0)) > ttl_s:
            continue
        known = latest.get(dispatcher_id)
        if known is None or float(snap.get("at", 0)) >= float(known.get("at", 0)):
            latest[dispatcher_id] = dict(snap)
    return latest


def _sum_counts(target: Counter[str], counts: Mapping[str, Any] | None) -> None:
    for name, value in (counts or {}).items():
        target[name] += int(value)


# Per-pool counts each dispatcher keeps for itself: the group's figure is their sum.
PER_DISPATCHER_COUNTS = ("lost_in_flight",)


def _merge_pools(ordered: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per pool: shared figures from the freshest snapshot, per-dispatcher figures summed or listed."""
    pools: dict[str, dict[str, Any]] = {}
    for snap in ordered:  # freshest first
        dispatcher_id = str(snap.get("dispatcher_id", ""))
        for pool in snap.get("pools", ()):
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


def _dispatcher_row(snap: Mapping[str, Any], now: float) -> dict[str, Any]:
    age_s = max(0.0, now - float(snap.get("at", 0)))
    return {
        "dispatcher_id": snap.get("dispatcher_id", ""),
        "gateway_id": snap.get("gateway_id", ""),
        "up_since": snap.get("up_since"),
        "uptime_s": round(max(0.0, now - float(snap.get("up_since") or now)), 1),
        # Snapshots travel through Valkey, so a dispatcher cut off from it cannot say so: its last word
        # stays "ok". One not heard from for longer than a few heartbeats cannot vouch for its link.
        "valkey_ok": bool(snap.get("valkey_ok", False)) and age_s <= STALE_AFTER_S,
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
    snapshots: Iterable[Mapping[str, Any]], *, now: float, stale_after_s: float = STALE_AFTER_S
) -> dict[str, Any]:
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
        for item in snap.get("active", ()):
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
    view: dict[str, Any], *, pools: Iterable[Mapping[str, Any]], queue_lengths: Mapping[str, int]
) -> dict[str, Any]:
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
    return {**view, "pools": merged, "queued": sum(int(p.get("queue_depth") or 0) for p in merged)}


# Counters without a detail part; those past the first two appear only once a dispatcher counted one.
# retried/requeued/dead_lettered: durable delivery and retries (redelivery outcomes of an attempt).
REDELIVERY_COUNTERS = ("retried", "requeued", "dead_lettered")
PLAIN_COUNTERS = ("completed", "valkey_outages", "internal_error", "config_rejected", *REDELIVERY_COUNTERS)


def counter_totals(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """The group's cumulative counter hash (``completed``, ``failed:<type>``, ``dropped:<reason>``)."""
    totals: dict[str, Any] = {"completed": 0, "failed": {}, "dropped": {}, "valkey_outages": 0}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        count = int(value)
        kind, _, detail = name.partition(":")
        if kind in ("failed", "dropped") and detail:
            totals[kind][detail] = count
        elif kind in PLAIN_COUNTERS:
            totals[kind] = count
    totals["failed"] = dict(sorted(totals["failed"].items()))
    totals["dropped"] = dict(sorted(totals["dropped"].items()))
    totals["failed_total"] = sum(totals["failed"].values())
    totals["dropped_total"] = sum(totals["dropped"].values())
    return totals


class Reason(TypedDict):
    """How the dashboard names a drop or skip reason, and what it tells the operator."""

    label: str
    explanation: str


# Reasons the dispatcher reports as plain strings. One it reports that is not listed here still shows
# up everywhere, under its own name (see reason_for), so a new reason needs no dashboard release.
DROP_REASON_TEXT: dict[str, Reason] = {
    DROP_MALFORMED: Reason(
        label="Malformed items",
        explanation="An item in the queue could not be decoded; it was removed and the next one served.",
    ),
    DROP_PRODUCER_GONE: Reason(
        label="Producer gone before execution",
        explanation="The producer's liveness key was gone before the call started: never executed.",
    ),
    DROP_REPLY_PRODUCER_GONE: Reason(
        label="Producer gone before the reply",
        explanation="The call ran, but the producer had gone before its reply could be delivered.",
    ),
    DROP_EXPIRED: Reason(
        label="Expired in the queue",
        explanation="The request's deadline passed while it waited in its queue: never executed.",
    ),
    DROP_REPLY_UNDELIVERED: Reason(
        label="Reply undelivered (Valkey)",
        explanation="Valkey failed while the reply was being written for the producer.",
    ),
    DROP_LOST_IN_FLIGHT: Reason(
        label="Lost in flight",
        explanation="A running call's lease expired (its dispatcher died or stalled): the call is lost.",
    ),
    "stale_attempt": Reason(
        label="Stale attempt (fenced)",
        explanation="A durable request's result from a dispatcher whose lease had expired meanwhile: the "
        "request ran again elsewhere, so this result was discarded and its producer got one reply.",
    ),
    DROP_DUPLICATE: Reason(
        label="Duplicate of a running request",
        explanation="A copy of a request already running in its pool arrived: removed, not executed.",
    ),
    "internal_error": Reason(
        label="Internal error",
        explanation="The dispatcher failed unexpectedly while handling the request; its log has the details.",
    ),
    "config_rejected": Reason(
        label="Configuration rejected",
        explanation="The published configuration refused the request (e.g. its pool is not configured).",
    ),
}
SKIP_REASON_TEXT: dict[str, Reason] = {
    "no_credit": Reason(
        label="waiting for credit",
        explanation="The request at the head costs more than the pool's DRR credit; it starts once the "
        "pool has earned enough on its next turns.",
    ),
    "pool_cap": Reason(
        label="pool at its max",
        explanation="The pool already runs its max concurrent calls; the next one starts when one finishes.",
    ),
    "group_cap": Reason(
        label="group at its total",
        explanation="The fabric group's total concurrency is in use across all its dispatchers.",
    ),
    "reserved": Reason(
        label="slots kept for others",
        explanation="The only free slots are protected (min concurrent) for other pools that have a backlog.",
    ),
    "paused": Reason(
        label="paused",
        explanation="An operator paused the pool; its queued work stays queued until it is resumed.",
    ),
    "local_capacity": Reason(
        label="dispatcher full",
        explanation="This dispatcher runs all the calls its --concurrency allows; another may take the work.",
    ),
    "breaker_open": Reason(
        label="backend failing",
        explanation="The backend failed repeatedly: calls are held in the queue until a probe succeeds.",
    ),
    "backend_saturated": Reason(
        label="backend saturated",
        explanation="The backend's own queue or KV cache is full (its metrics say so): work waits in our "
        "queue, where DRR orders it, instead of in the backend's FIFO.",
    ),
    "backend_cap": Reason(
        label="backend at its max",
        explanation="The backend has its max in flight across every pool and dispatcher that uses it.",
    ),
}
# The circuit breaker's modes in an operator's words ("closed" in green reads as "down").
BREAKER_TEXT: dict[str, Reason] = {
    "closed": Reason(label="healthy", explanation="Calls go through; failures are being counted."),
    "open": Reason(
        label="failing (calls held)",
        explanation="The backend failed repeatedly; calls wait in their queues instead of failing too.",
    ),
    "half_open": Reason(
        label="probing", explanation="One trial call checks whether the backend has recovered."
    ),
}
DROP_LABELS = {reason: text["label"] for reason, text in DROP_REASON_TEXT.items()}


def reason_for(table: Mapping[str, Reason], reason: str) -> Reason:
    """The text of a reason, or one made from its name when the dashboard does not know it yet."""
    known = table.get(reason)
    if known is not None:
        return known
    return Reason(label=reason.replace("_", " "), explanation=f"Reported by the dispatcher as “{reason}”.")


def reason_texts() -> dict[str, dict[str, Reason]]:
    """Every text the live page needs to name reasons and breaker modes (sent once, as JSON)."""
    return {"drop": DROP_REASON_TEXT, "skip": SKIP_REASON_TEXT, "breaker": BREAKER_TEXT}


def known_drop_reasons(view: Mapping[str, Any]) -> list[str]:
    """The dispatcher's drop reasons (even at zero), then any other the view reports."""
    totals = view.get("totals") or {}
    seen = set(view.get("dropped") or {}) | set(totals.get("dropped") or {})
    return [*DROP_REASONS, *sorted(seen - set(DROP_REASONS))]


def legend(view: Mapping[str, Any]) -> dict[str, list[dict[str, str]]]:
    """Drop and skip reasons with their explanations: every known one, then any other the view reports."""
    drops = known_drop_reasons(view)
    seen_skips = {r for p in view.get("pools") or () for r in (p.get("skips") or {})}
    skips = [*SKIP_REASON_TEXT, *sorted(seen_skips - set(SKIP_REASON_TEXT))]
    return {
        "drop": [{"reason": r, **reason_for(DROP_REASON_TEXT, r)} for r in drops],
        "skip": [{"reason": r, **reason_for(SKIP_REASON_TEXT, r)} for r in skips],
    }


def breaker_pills(breakers: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One pill per backend: its breaker mode in plain words, a colour class and how often it opened."""
    css = {"closed": "ok", "open": "bad"}
    return [
        {"url": url, "cls": css.get(str(b.get("mode")), "warn"), "trips": int(b.get("trips") or 0),
         **reason_for(BREAKER_TEXT, str(b.get("mode")))}
        for url, b in breakers.items()
    ]  # fmt: skip


def skip_chips(skips: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"reason": r, "count": n, **reason_for(SKIP_REASON_TEXT, r)} for r, n in skips.items()]


def counter_rows(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Drops by reason (every known reason, even at zero) then failures by type: live and all-time."""
    totals = view.get("totals") or counter_totals({})
    rows = []
    for reason in known_drop_reasons({**view, "totals": totals}):
        text = reason_for(DROP_REASON_TEXT, reason)
        rows.append(
            {
                "reason": reason,
                "label": f"Dropped: {text['label']}",
                "explanation": text["explanation"],
                "live": view["dropped"].get(reason, 0),
                "total": totals["dropped"].get(reason, 0),
            }
        )
    for error_type in sorted(set(view["failed"]) | set(totals["failed"])):
        rows.append(
            {
                "reason": error_type,
                "label": f"Failed: {error_type}",
                "explanation": "Calls that ended with this error type (see History for each one).",
                "live": view["failed"].get(error_type, 0),
                "total": totals["failed"].get(error_type, 0),
            }
        )
    return rows


# --- Valkey reads ----------------------------------------------------------------------------------
def snapshots_read(*, group_id: str, client: redis.Redis | None = None) -> list[dict[str, Any]]:
    """The latest snapshot of every live dispatcher of the group (SCAN of the snapshot keys + MGET)."""
    own = client is None
    client = client or sync_client()
    try:
        names = list(client.scan_iter(match=key_space().snapshot_pattern(group_id), count=_SCAN_COUNT))
        raws = client.mget(names) if names else []
    finally:
        if own:
            client.close()
    snapshots = []
    for raw in raws:
        if not raw:
            continue  # expired between SCAN and MGET
        try:
            snapshots.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            log.warning("ignoring an undecodable dispatcher snapshot of group %s", group_id)
    return snapshots


def counters_read(*, group_id: str, client: redis.Redis | None = None) -> dict[str, Any]:
    own = client is None
    client = client or sync_client()
    try:
        return counter_totals(client.hgetall(key_space().counters(group_id)))
    finally:
        if own:
            client.close()


def queue_lengths_read(*, pool_ids: list[str], client: redis.Redis) -> dict[str, int]:
    if not pool_ids:
        return {}
    keys = key_space()
    pipe = client.pipeline(transaction=False)
    for pool_id in pool_ids:
        pipe.llen(keys.requests(pool_id))
    return dict(zip(pool_ids, (int(n) for n in pipe.execute()), strict=True))


def rejections_by_pool(raw: Mapping[Any, Any]) -> dict[str, dict[str, int]]:
    """The rejections hash (``{pool_id}:{reason}`` -> count) as pool -> reason -> count."""
    found: dict[str, dict[str, int]] = {}
    for key, value in raw.items():
        text = key.decode() if isinstance(key, bytes) else str(key)
        pool_id, _, reason = text.rpartition(":")
        if pool_id:
            found.setdefault(pool_id, {})[reason] = int(value)
    return found


def backends_read(*, group_id: str, client: redis.Redis, now: float) -> tuple[list[dict[str, Any]], dict]:
    """The live status of the group's backends (as published with the group) and the rejections per
    pool and reason. Raises redis errors (see VALKEY_ERRORS)."""
    keys = key_space()
    raw_config = client.get(keys.group_config(group_id))
    backends = ()
    if raw_config:
        try:
            backends = GroupConfig.decode(raw_config).backends
        except DispatchError:
            log.warning("dashboard: the published configuration of group %s is unreadable", group_id)
    pipe = client.pipeline(transaction=False)
    for backend in backends:
        queue_reads(pipe, keys, backend.backend_id, now)
    pipe.hgetall(keys.rejections())
    replies = pipe.execute()
    statuses = []
    for i, backend in enumerate(backends):
        status = status_from_replies(backend, replies[3 * i : 3 * i + 3], now)
        statuses.append(
            {
                **dataclasses.asdict(status),
                "breaker_words": status.breaker_words,
                "metrics_words": status.metrics_words(),
            }
        )
    return statuses, rejections_by_pool(replies[-1])


def configured_pools(*, group_id: str) -> list[dict[str, Any]]:
    """The group's pools as configured in the database, with their admin and history links.

    Raises FabricGroup.DoesNotExist.
    """
    from django.urls import reverse

    from pools import selectors as pool_selectors

    group = pool_selectors.group_get(group_id=group_id)
    return [
        {
            "pool_id": p.pool_id,
            "display_name": p.display_name or p.pool_id,
            "weight": p.quantum,
            "min_concurrent": p.min_concurrent,
            "max_concurrent": p.max_concurrent,
            "max_burst_per_visit": p.max_burst_per_visit,
            "enabled": p.enabled,
            "paused": p.paused,
            "max_queued": p.max_queued,
            "admin_url": reverse("admin:pools_pool_change", args=[p.pk]),
            "dead_letters_url": reverse("admin:pools_pool_dead_letters", args=[p.pk]),
        }
        for p in pool_selectors.group_pools(group=group)
    ]


def finish_view(
    view: dict[str, Any],
    *,
    group_id: str,
    configured: list[dict[str, Any]],
    queue_lengths: Mapping[str, int],
    totals: dict[str, Any],
    backends: list[dict[str, Any]] | None = None,
    rejections: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """Adds what snapshots do not carry: unobserved pools, links, the group's cumulative counters,
    the backends' live status and the submits refused per pool."""
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
    view["totals"] = totals
    view["live_queue_depth"] = dict(queue_lengths)
    view["dead_letters"] = dead_letter_rows(totals.get("dead_letters", {}), configured, now=time.time())
    view["dead_letters_total"] = sum(row["count"] for row in view["dead_letters"])
    return view


def dead_letter_rows(
    summaries: Mapping[str, Mapping[str, Any]], configured: list[dict[str, Any]], *, now: float
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


class FabricRead(TypedDict):
    snapshots: list[dict[str, Any]]
    lengths: dict[str, int]
    totals: dict[str, Any]  # with each pool's dead letters under ``dead_letters``
    backends: list[dict[str, Any]]
    rejections: dict[str, dict[str, int]]


def fabric_read(*, group_id: str, pool_ids: list[str], now: float | None = None) -> FabricRead:
    """Snapshots, live queue lengths of ``pool_ids``, the counter totals (with each pool's dead
    letters under ``dead_letters``), the backends' live status and the rejections, in one connection.

    Raises redis errors (see VALKEY_ERRORS).
    """
    client = sync_client()
    try:
        snapshots = snapshots_read(group_id=group_id, client=client)
        lengths = queue_lengths_read(pool_ids=pool_ids, client=client)
        totals = counters_read(group_id=group_id, client=client)
        totals["dead_letters"] = {
            summary.pool_id: {"count": summary.count, "oldest_dead_at": summary.oldest_dead_at}
            for summary in deadletters.summaries(client, key_space(), pool_ids)
        }
        backends, rejections = backends_read(
            group_id=group_id, client=client, now=time.time() if now is None else now
        )
    finally:
        client.close()
    return FabricRead(
        snapshots=snapshots, lengths=lengths, totals=totals, backends=backends, rejections=rejections
    )


def fabric_view(
    *, group_id: str, configured: list[dict[str, Any]] | None = None, now: float | None = None
) -> dict[str, Any]:
    """The merged live view of a group, plus cumulative counters and unobserved configured pools.

    Never raises for Valkey trouble: the view then carries ``valkey_error`` and no dispatchers.
    """
    now = time.time() if now is None else now
    configured = configured or []
    error = ""
    try:
        read = fabric_read(group_id=group_id, pool_ids=[p["pool_id"] for p in configured], now=now)
    except VALKEY_ERRORS as exc:
        log.warning("dashboard cannot read Valkey: %s", exc)
        error = str(exc)
        read = FabricRead(snapshots=[], lengths={}, totals=counter_totals({}), backends=[], rejections={})
    view = merge_snapshots(read["snapshots"], now=now)
    view["valkey_error"] = error
    return finish_view(
        view, group_id=group_id, configured=configured, queue_lengths=read["lengths"], totals=read["totals"],
        backends=read["backends"], rejections=read["rejections"],
    )  # fmt: skip
