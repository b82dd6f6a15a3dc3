"""Issue 9's new counters reach the operator: calls lost in flight per pool, refused configurations and
internal errors, in the merged view and in /metrics (Django's test client on the test Valkey)."""

from __future__ import annotations

import time

import orjson
from prometheus_client.parser import text_string_to_metric_families

from dashboard import merge, reasons
from tests.support.pools_admin import dead_letter
from tests.support.snapshots import pool, snap


def test_lost_in_flight_is_summed_per_pool_over_dispatchers() -> None:
    now = time.time()
    view = merge.merge_snapshots(
        [
            snap("d1", now, [pool("a", lost_in_flight=2), pool("b")], dropped={"lost_in_flight": 2}),
            snap("d2", now - 1, [pool("a", lost_in_flight=1)], dropped={"lost_in_flight": 1},
                 config_rejected=1, internal_errors=4),
        ],
        now=now,
    )  # fmt: skip
    assert {p["pool_id"]: p["lost_in_flight"] for p in view["pools"]} == {"a": 3, "b": 0}
    assert view["dropped"] == {"lost_in_flight": 3}
    rows = {r["dispatcher_id"]: r for r in view["dispatchers"]}
    assert (rows["d2"]["config_rejected"], rows["d2"]["internal_errors"]) == (1, 4)
    labels = [r["label"] for r in reasons.counter_rows(view)]
    assert "Dropped: Lost in flight" in labels
    assert "Dropped: Duplicate of a running request" in labels


def test_metrics_show_lost_calls_refused_configs_and_internal_errors(client, fabric, sredis, keys) -> None:
    pools = [pool("interactive", lost_in_flight=2), pool("backfill")]
    sredis.set(keys.snapshot("g", "d1"), orjson.dumps(snap("d1", time.time(), pools)), px=10_000)
    sredis.hset(
        keys.counters("g"),
        mapping={"dropped:lost_in_flight": 2, "config_rejected": 1, "internal_error": 3},
    )
    text = client.get("/metrics").content.decode()
    samples = {
        (s.name, s.labels.get("pool", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("fabric_group") == "g" and s.labels.get("reason") in (None, "lost_in_flight")
    }
    assert samples[("llm_dispatch_lost_in_flight_total", "interactive")] == 2
    assert samples[("llm_dispatch_lost_in_flight_total", "backfill")] == 0
    assert samples[("llm_dispatch_drops_total", "")] == 2
    assert samples[("llm_dispatch_config_rejected_total", "")] == 1
    assert samples[("llm_dispatch_internal_errors_total", "")] == 3
    assert merge.counter_totals(sredis.hgetall(keys.counters("g")))["config_rejected"] == 1


def test_metrics_show_each_pools_dead_letters(client, fabric, sredis, keys) -> None:
    sredis.rpush(
        keys.dead_letters("backfill"), dead_letter("d-1"), dead_letter("d-2", dead_at=time.time() - 30)
    )
    text = client.get("/metrics").content.decode()
    samples = {
        (s.name, s.labels["pool"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("fabric_group") == "g" and "dead_letter" in s.name
    }
    assert samples[("llm_dispatch_dead_letters", "backfill")] == 2
    assert samples[("llm_dispatch_dead_letters", "interactive")] == 0
    assert samples[("llm_dispatch_oldest_dead_letter_age_seconds", "backfill")] >= 0
    assert ("llm_dispatch_oldest_dead_letter_age_seconds", "interactive") not in samples


def test_metrics_show_retries_requeues_and_dead_letterings(client, fabric, sredis, keys) -> None:
    sredis.hset(keys.counters("g"), mapping={"retried": 4, "requeued": 2})
    text = client.get("/metrics").content.decode()
    samples = {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "llm_dispatch_redeliveries_total" and s.labels.get("fabric_group") == "g"
    }
    assert samples == {"retried": 4, "requeued": 2, "dead_lettered": 0}
