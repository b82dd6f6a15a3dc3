"""Form data for the admin's group page (group fields + pools inline) and the pool changelist."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pools.models import FabricGroup, Pool
from runtime.dispatch import deadletters
from runtime.wire.contract import ChatCall, Envelope

POOL_DEFAULTS = {
    "display_name": "",
    "quantum": 1,
    "min_concurrent": 0,
    "max_concurrent": 8,
    "max_burst_per_visit": 1,
    "backend": "",
    "max_queued": "",
    "max_queue_wait_s": "",
    "enabled": True,
    "paused": False,
    "sort_order": 0,
    "max_attempts": 1,
    "retry_backoff_base_s": 0.5,
    "retry_backoff_cap_s": 30.0,
    "max_requeues": 3,
    "tenant_fairness": "off",
    "tenant_input_weight": 1.0,
    "tenant_output_weight": 4.0,
    "tenant_default_output_tokens": 256,
    "max_queued_per_tenant": "",
}


def _flag(data: dict[str, Any], key: str, value: bool) -> None:
    if value:
        data[key] = "on"


def group_form(
    group: dict[str, Any],
    pools: list[dict[str, Any]],
    *,
    initial: int = 0,
    aliases: Sequence[dict[str, Any]] = (),
    initial_aliases: int = 0,
) -> dict[str, Any]:
    """POST data of the group add/change page; ``pools`` rows may carry ``id`` and ``DELETE``, as may
    the model ``aliases`` rows (``alias``, ``pool`` (its primary key), ``backend_model``)."""
    data: dict[str, Any] = {
        "name": group.get("name", ""),
        "policy": group.get("policy", "drr"),
        "cost_mode": group.get("cost_mode", "units"),
        "backend": group.get("backend", ""),
        "total_concurrency": group.get("total_concurrency", 16),
        "delivery": group.get("delivery", "lists"),
        "persist_replicas": group.get("persist_replicas", 0),
        "pools-TOTAL_FORMS": len(pools),
        "pools-INITIAL_FORMS": initial,
        "pools-MIN_NUM_FORMS": 0,
        "pools-MAX_NUM_FORMS": 1000,
        "aliases-TOTAL_FORMS": len(aliases),
        "aliases-INITIAL_FORMS": initial_aliases,
        "aliases-MIN_NUM_FORMS": 0,
        "aliases-MAX_NUM_FORMS": 1000,
        "_save": "Save",
    }
    for i, alias in enumerate(aliases):
        for name, value in {"backend_model": "", **alias}.items():
            if name == "DELETE":
                _flag(data, f"aliases-{i}-{name}", value)
            else:
                data[f"aliases-{i}-{name}"] = value
    if "group_id" in group:
        data["group_id"] = group["group_id"]
    _flag(data, "queueing_enabled", group.get("queueing_enabled", True))
    for i, row in enumerate(pools):
        row = {**POOL_DEFAULTS, **row}
        for name, value in row.items():
            if name in ("enabled", "paused", "DELETE"):
                _flag(data, f"pools-{i}-{name}", value)
            else:
                data[f"pools-{i}-{name}"] = value
    return data


def existing_rows(group: FabricGroup, **changes: dict[str, Any]) -> list[dict[str, Any]]:
    """The group's stored pools as inline rows, with per-pool_id changes applied."""
    rows = []
    for pool in Pool.objects.filter(group=group).order_by("sort_order", "pool_id"):
        row = {name: getattr(pool, name) for name in POOL_DEFAULTS if name != "backend"}
        row["backend"] = pool.backend_id or ""
        row = {name: "" if value is None else value for name, value in row.items()}
        row.update(
            id=pool.pk,
            pool_id=pool.pool_id,
            group=group.pk,
            **changes.get(pool.pool_id.replace("-", "_"), {}),
        )
        rows.append(row)
    return rows


def changelist_form(pools: list[Pool], **changes: dict[str, Any]) -> dict[str, Any]:
    """POST data of the pool changelist's list-editable formset."""
    data: dict[str, Any] = {
        "form-TOTAL_FORMS": len(pools),
        "form-INITIAL_FORMS": len(pools),
        "form-MIN_NUM_FORMS": 0,
        "form-MAX_NUM_FORMS": 1000,
        "_save": "Save",
    }
    for i, pool in enumerate(pools):
        row = {
            name: getattr(pool, name)
            for name in ("quantum", "min_concurrent", "max_concurrent", "max_burst_per_visit")
        }
        row.update(changes.get(pool.pool_id.replace("-", "_"), {}))
        data[f"form-{i}-id"] = pool.pk
        for name, value in row.items():
            data[f"form-{i}-{name}"] = value
    return data


def dead_letter(request_id: str, *, pool_id: str = "backfill", dead_at: float | None = None) -> bytes:
    """A stored dead letter: a request that failed three attempts with 503."""
    envelope = Envelope(
        request_id,
        "p1",
        pool_id,
        ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        enqueued_at=time.time() - 60,
        deadline=time.time() - 1,
        attempt=3,
    )
    return deadletters.DeadLetter.of(
        envelope,
        reason=deadletters.ATTEMPTS_EXHAUSTED,
        error_type="backend_http_error",
        error_message="backend answered HTTP 503: overloaded",
        now=time.time() if dead_at is None else dead_at,
    ).encode()


def errors_of(response: Any) -> str:
    """Every error the admin page shows (main form, inline formsets, changelist formset), as one text."""
    context = response.context
    found: list[str] = []
    if "adminform" in context:
        form = context["adminform"].form
        found += [str(m) for messages in form.errors.values() for m in messages]
    for inline in context.get("inline_admin_formsets") or []:
        found += [str(m) for errors in inline.formset.errors for ms in errors.values() for m in ms]
        found += [str(m) for m in inline.formset.non_form_errors()]
    changelist = context.get("cl")
    if changelist is not None and changelist.formset is not None:
        found += [str(m) for errors in changelist.formset.errors for ms in errors.values() for m in ms]
        found += [str(m) for m in changelist.formset.non_form_errors()]
    return "\n".join(found)


POOL_ADD = "/admin/pools/pool/add/"


def pool_post(group: FabricGroup, **values: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "group": group.pk,
        "pool_id": "new-pool",
        **POOL_DEFAULTS,
        **values,
        "_save": "Save",
    }
    for flag in ("enabled", "paused"):
        if data.pop(flag):
            data[flag] = "on"
    return data
