"""Prometheus metrics of every fabric group, read from Valkey at scrape time.

A custom collector (no state kept in this process): queue depth is the live LLEN of every configured
pool; in-flight, deficit and skips come from the live dispatcher snapshots; completions, failures and
drops from the group's cumulative counter hash, so they survive dispatcher restarts.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dashboard import merge, selectors
from dashboard.tenant_metrics import TenantFamilies
from pools.connections import VALKEY_ERRORS

log = logging.getLogger(__name__)
PREFIX = "llm_dispatch"
GR = ["fabric_group"]
GP = [*GR, "pool"]


class _Families:
    """The metric families of one scrape, filled group by group."""

    def __init__(self) -> None:
        self._backends_seen: set[str] = set()
        g, c = GaugeMetricFamily, CounterMetricFamily
        self.queue_depth = g(f"{PREFIX}_queue_depth", "Pending requests in the pool's list (LLEN)", labels=GP)
        self.in_flight = g(
            f"{PREFIX}_in_flight", "Requests in flight in the pool, all dispatchers", labels=GP
        )
        self.max_concurrent = g(f"{PREFIX}_pool_max_concurrent", "Hard in-flight cap of the pool", labels=GP)
        self.min_concurrent = g(f"{PREFIX}_pool_min_concurrent", "Protected slots of the pool", labels=GP)
        self.weight = g(f"{PREFIX}_pool_weight", "DRR quantum (weight) of the pool", labels=GP)
        self.paused = g(f"{PREFIX}_pool_paused", "1 when the pool is paused", labels=GP)
        self.oldest = g(
            f"{PREFIX}_oldest_pending_age_seconds", "Age of the request at the pool's head", labels=GP
        )
        self.deficit = g(
            f"{PREFIX}_deficit", "DRR credit of the pool per dispatcher", labels=[*GP, "dispatcher"]
        )
        self.skips = c(
            f"{PREFIX}_skips", "Scheduler skips by reason, live dispatchers", labels=[*GP, "reason"]
        )
        self.launched = c(f"{PREFIX}_launched", "Requests launched, live dispatchers", labels=GP)
        self.lost_in_flight = c(
            f"{PREFIX}_lost_in_flight",
            "Calls lost with a dispatcher that died (lease expired), counted by live dispatchers",
            labels=GP,
        )
        self.dead_letters = g(
            f"{PREFIX}_dead_letters",
            "Dead letters waiting in the pool's list for Replay or Discard",
            labels=GP,
        )
        self.oldest_dead_letter = g(
            f"{PREFIX}_oldest_dead_letter_age_seconds", "Age of the pool's oldest dead letter", labels=GP
        )
        self.internal_errors = c(
            f"{PREFIX}_internal_errors", "Unexpected errors a dispatcher caught and survived", labels=GR
        )
        self.config_rejected = c(
            f"{PREFIX}_config_rejected", "Published configurations a dispatcher refused", labels=GR
        )
        self.completions = c(f"{PREFIX}_completions", "Completed calls", labels=GR)
        self.redeliveries = c(
            f"{PREFIX}_redeliveries",
            "Attempts that did not end their request: retried, requeued (lease expired, shutdown), "
            "dead-lettered",
            labels=[*GR, "outcome"],
        )
        self.unpersisted = c(
            f"{PREFIX}_unpersisted_pushes",
            "Durable pushes answered without the persistence asked for, by outcome",
            labels=[*GR, "outcome"],
        )
        self.failures = c(f"{PREFIX}_failures", "Failed calls by error type", labels=[*GR, "error_type"])
        self.drops = c(f"{PREFIX}_drops", "Dropped requests or replies by reason", labels=[*GR, "reason"])
        self.running = g(f"{PREFIX}_dispatchers_running", "Dispatchers with a live snapshot", labels=GR)
        self.group_in_flight = g(f"{PREFIX}_group_in_flight", "In-flight requests of the group", labels=GR)
        self.snapshot_age = g(
            f"{PREFIX}_snapshot_age_seconds", "Age of the freshest dispatcher snapshot", labels=GR
        )
        self.rejections = c(
            f"{PREFIX}_rejections", "Submits refused by admission control, by reason", labels=[*GP, "reason"]
        )
        gb = ["backend"]
        self.backend_in_flight = g(
            f"{PREFIX}_backend_in_flight", "Our calls in flight to the backend", labels=gb
        )
        self.backend_limit = g(
            f"{PREFIX}_backend_in_flight_limit", "In-flight calls the load gate allows now", labels=gb
        )
        self.backend_running = g(
            f"{PREFIX}_backend_running", "Requests the backend runs (scraped)", labels=gb
        )
        self.backend_waiting = g(
            f"{PREFIX}_backend_waiting", "Requests in the backend's own queue (scraped)", labels=gb
        )
        self.backend_kv = g(f"{PREFIX}_backend_kv_cache_usage", "KV-cache usage 0..1 (scraped)", labels=gb)
        self.backend_metrics_age = g(
            f"{PREFIX}_backend_metrics_age_seconds", "Age of the backend's shared metrics", labels=gb
        )
        self.backend_metrics_fresh = g(
            f"{PREFIX}_backend_metrics_fresh", "1 while gating uses fresh metrics", labels=[*gb, "metrics"]
        )
        self.backend_breaker = g(
            f"{PREFIX}_backend_breaker_open",
            "1 while the backend's shared breaker is not closed",
            labels=[*gb, "mode"],
        )
        self.valkey_up = g(f"{PREFIX}_valkey_up", "1 when this scrape could read Valkey")
        self.breaker_open = g(
            f"{PREFIX}_breaker_open",
            "1 while a dispatcher's circuit breaker for a backend is not closed",
            labels=[*GR, "dispatcher", "backend", "mode"],
        )

    def all(self) -> list[Metric]:
        return [v for v in vars(self).values() if isinstance(v, Metric)]

    def add_group(self, view: merge.FabricView) -> None:
        group = str(view["group_id"])
        for pool in view["pools"]:
            labels = [group, pool["pool_id"]]
            self.queue_depth.add_metric(labels, int(pool.get("queue_depth") or 0))
            if pool.get("in_flight") is not None:
                self.in_flight.add_metric(labels, int(pool["in_flight"]))
            self.max_concurrent.add_metric(labels, int(pool.get("max_concurrent") or 0))
            self.min_concurrent.add_metric(labels, int(pool.get("min_concurrent") or 0))
            self.weight.add_metric(labels, int(pool.get("weight") or 0))
            self.paused.add_metric(labels, 1 if pool.get("paused") else 0)
            if pool.get("oldest_pending_age_s") is not None:
                self.oldest.add_metric(labels, float(pool["oldest_pending_age_s"]))
            for dispatcher_id, deficit in sorted(pool.get("deficit", {}).items()):
                self.deficit.add_metric([*labels, dispatcher_id], float(deficit))
            for reason, count in pool.get("skips", {}).items():
                self.skips.add_metric([*labels, reason], int(count))
            self.launched.add_metric(labels, int(pool.get("launched") or 0))
            self.add_rejections(labels, pool.get("rejected", {}))
            self.lost_in_flight.add_metric(labels, int(pool.get("lost_in_flight") or 0))
        self.add_totals(group, view["totals"])
        for dispatcher in view.get("dispatchers", []):
            for backend, breaker in dispatcher.get("breakers", {}).items():
                mode = str(breaker.get("mode", ""))
                labels = [group, str(dispatcher["dispatcher_id"]), backend, mode]
                self.breaker_open.add_metric(labels, 0 if mode == "closed" else 1)
        for backend in view.get("backends", []):
            self.add_backend(backend)
        self.running.add_metric([group], view["dispatchers_running"])
        self.group_in_flight.add_metric([group], view["group_in_flight"])
        if view["age_s"] is not None:
            self.snapshot_age.add_metric([group], view["age_s"])

    def add_totals(self, group: str, totals: dict[str, Any]) -> None:
        """The group's cumulative counters (and its pools' dead letters, read with them)."""
        self.add_dead_letters(group, totals.get("dead_letters", {}), now=time.time())
        self.completions.add_metric([group], int(totals["completed"]))
        for outcome in merge.REDELIVERY_COUNTERS:
            self.redeliveries.add_metric([group, outcome], int(totals.get(outcome, 0)))
        self.internal_errors.add_metric([group], int(totals.get("internal_error", 0)))
        self.config_rejected.add_metric([group], int(totals.get("config_rejected", 0)))
        for error_type, count in totals["failed"].items():
            self.failures.add_metric([group, error_type], count)
        for reason, count in totals["dropped"].items():
            self.drops.add_metric([group, reason], count)
        for outcome, count in totals.get("unpersisted", {}).items():
            self.unpersisted.add_metric([group, outcome], count)

    def add_dead_letters(self, group: str, summaries: dict[str, dict[str, Any]], *, now: float) -> None:
        """Every configured pool's dead-letter count (0 included, so an alert sees it appear)."""
        for pool_id, summary in sorted(summaries.items()):
            self.dead_letters.add_metric([group, pool_id], int(summary["count"]))
            if summary.get("oldest_dead_at") is not None:
                age = max(0.0, now - float(summary["oldest_dead_at"]))
                self.oldest_dead_letter.add_metric([group, pool_id], age)

    def add_rejections(self, labels: list[str], rejected: dict[str, int]) -> None:
        for reason, count in sorted(rejected.items()):
            self.rejections.add_metric([*labels, reason], int(count))

    def add_backend(self, backend: dict[str, Any]) -> None:
        """A backend shared by several groups is reported once."""
        backend_id = str(backend["backend_id"])
        if backend_id in self._backends_seen:
            return
        self._backends_seen.add(backend_id)
        labels = [backend_id]
        self.backend_in_flight.add_metric(labels, int(backend["in_flight"]))
        self.backend_limit.add_metric(labels, int(backend["limit"]))
        scraped = (
            ("running", self.backend_running),
            ("waiting", self.backend_waiting),
            ("kv_usage", self.backend_kv),
            ("metrics_age_s", self.backend_metrics_age),
        )
        for name, family in scraped:
            if backend.get(name) is not None:
                family.add_metric(labels, float(backend[name]))
        self.backend_metrics_fresh.add_metric(
            [*labels, str(backend["metrics"])], 1 if backend["metrics"] == "fresh" else 0
        )
        mode = str(backend["breaker"])
        self.backend_breaker.add_metric([*labels, mode], 0 if mode == "closed" else 1)


class FabricCollector:
    """Collects every fabric group's live figures at scrape time."""

    def describe(self) -> list[Metric]:
        return []  # nothing to describe up front; collect() reads Valkey

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        tenants = TenantFamilies()
        ok = True
        now = time.time()
        for group_id in _group_ids():
            configured = selectors.configured_pools(group_id=group_id)
            # Snapshots report observed pools; the live LLEN below is the truth for queue depth.
            view = selectors.fabric_view(group_id=group_id, configured=configured, now=now)
            ok = ok and not view.get("valkey_error")
            view["pools"] = [_with_live_depth(p, view) for p in view["pools"]]
            families.add_group(view)
            if ok:
                with contextlib.suppress(*VALKEY_ERRORS):
                    tenants.add(group_id, [p["pool_id"] for p in configured])
        families.valkey_up.add_metric([], 1 if ok else 0)
        yield from families.all()
        yield from tenants.all()


def _with_live_depth(pool: dict[str, Any], view: merge.FabricView) -> dict[str, Any]:
    depth = view.get("live_queue_depth", {}).get(pool["pool_id"])
    return pool if depth is None else {**pool, "queue_depth": depth}


def _group_ids() -> list[str]:
    from pools import selectors as pool_selectors

    return [g.group_id for g in pool_selectors.group_list()]


_registry = CollectorRegistry(auto_describe=False)
_registry.register(FabricCollector())  # type: ignore[arg-type]


def render() -> bytes:
    return generate_latest(_registry)
