"""How the dashboard names drop reasons, skip reasons and breaker modes, and the rows built from them.

Pure: tables of texts and functions from a merged view (see :mod:`dashboard.merge`) to what the page
shows. A reason the dispatcher reports that is not listed still shows up, under its own name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from dashboard.merge import counter_totals
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
    "backend_retry_after": Reason(
        label="backend asked to wait",
        explanation="The backend answered 429 with a Retry-After: every dispatcher holds its pools' work "
        "in our queue until that time is over.",
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
    for outcome, count in sorted(totals.get("unpersisted", {}).items()):
        rows.append(
            {
                "reason": outcome,
                "label": f"Not persisted: {outcome}",
                "explanation": UNPERSISTED_TEXT.get(outcome, UNPERSISTED_TEXT[""]),
                "live": 0,
                "total": count,
            }
        )
    return rows


# Durable pushes a producer answered without the persistence asked for, by outcome (producers count
# them in the group's counters; runtime.valkey.persisted).
UNPERSISTED_TEXT = {
    "waitaof_unsupported": "Durable pushes answered once in memory: the Valkey/Redis server has no WAITAOF "
    "(Redis older than 7.2).",
    "aof_off": "Durable pushes not persisted locally: the server runs with its append-only file off.",
    "not_persisted": "Durable pushes whose WAITAOF/WAIT timed out short of the fsync or the replicas asked "
    "for (persist replicas).",
    "": "Durable pushes answered without the persistence asked for.",
}
