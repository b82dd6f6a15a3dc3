"""Staff-only dashboard pages, pool pause/resume, and the Prometheus ``/metrics`` endpoint.

The page is rendered complete on the server (first paint from the Valkey snapshots), then
``dashboard/fabric.js`` keeps it live over ``ws/fabric/<group_id>/``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import redirect, render
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_POST
from prometheus_client import CONTENT_TYPE_LATEST

from dashboard import metrics, reasons, selectors
from pools import selectors as pool_selectors
from pools import services as pool_services
from pools.models import FabricGroup, Pool

HISTORY_URL = "/history/"


def _first_url(*names: str, default: str) -> str:
    for name in names:
        try:
            return reverse(name)
        except NoReverseMatch:
            continue
    return default


def _links() -> dict[str, str]:
    return {
        "history": _first_url("history:recent", default=HISTORY_URL),
    }


@staff_member_required
def index(request: HttpRequest) -> HttpResponse:
    groups = list(pool_selectors.group_list())
    if len(groups) == 1:
        return redirect("dashboard:fabric", group_id=groups[0].group_id)
    summaries = []
    for group in groups:
        view = selectors.fabric_view(group_id=group.group_id)
        summaries.append({"group": group, "view": view})
    return render(request, "dashboard/index.html", {"summaries": summaries, "links": _links()})


@staff_member_required
def fabric(request: HttpRequest, group_id: str) -> HttpResponse:
    try:
        group = pool_selectors.group_get(group_id=group_id)
    except FabricGroup.DoesNotExist:
        raise Http404(f"no fabric group {group_id!r}") from None
    configured = selectors.configured_pools(group_id=group_id)
    view = selectors.fabric_view(group_id=group_id, configured=configured, now=time.time())
    for row in view["dispatchers"]:
        row["up_since_dt"] = datetime.fromtimestamp(float(row["up_since"] or 0), tz=UTC)
        row["breaker_pills"] = reasons.breaker_pills(row["breakers"])
        since = row["valkey_reconnected_at"]
        row["valkey_since_dt"] = datetime.fromtimestamp(float(since), tz=UTC) if since else None
    for pool in view["pools"]:
        pool["skip_chips"] = reasons.skip_chips(pool["skips"])
    context: dict[str, Any] = {
        "group": group,
        "groups": list(pool_selectors.group_list()),
        "view": view,
        "links": _links(),
        "ws_path": f"/ws/fabric/{group_id}/",
        "counter_rows": reasons.counter_rows(view),
        "texts": reasons.reason_texts(),
        "legend": reasons.legend(view),
        "drop_reasons": " ".join(reasons.known_drop_reasons({})),
        "max_queue": max([int(p.get("queue_depth") or 0) for p in view["pools"]] + [1]),
        "rejected_total": sum(sum(p.get("rejected", {}).values()) for p in view["pools"]),
    }
    return render(request, "dashboard/fabric.html", context)


def _set_paused(request: HttpRequest, group_id: str, pool_id: str, *, paused: bool) -> HttpResponse:
    try:
        pool = pool_selectors.pool_get(pool_id=pool_id)
    except Pool.DoesNotExist:
        raise Http404(f"no pool {pool_id!r}") from None
    if pool.group_id != group_id:
        raise Http404(f"pool {pool_id!r} is not in fabric group {group_id!r}")
    results = pool_services.pool_pause(pool=pool) if paused else pool_services.pool_resume(pool=pool)
    errors = [r.error for r in results if not r.ok]
    wants_json = request.headers.get("Accept", "").startswith("application/json")
    if wants_json:
        version = max((r.version for r in results if r.ok), default=0)
        body = {"pool_id": pool_id, "paused": paused, "published": not errors, "errors": errors}
        return JsonResponse({**body, "version": version})
    verb = "Paused" if paused else "Resumed"
    messages.success(request, f"{verb} pool {pool_id}.")
    for error in errors:
        messages.warning(request, f"Saved, but not published to the dispatchers: {error}")
    return HttpResponseRedirect(reverse("dashboard:fabric", args=[group_id]))


@staff_member_required
@require_POST
def pool_pause(request: HttpRequest, group_id: str, pool_id: str) -> HttpResponse:
    return _set_paused(request, group_id, pool_id, paused=True)


@staff_member_required
@require_POST
def pool_resume(request: HttpRequest, group_id: str, pool_id: str) -> HttpResponse:
    return _set_paused(request, group_id, pool_id, paused=False)


def prometheus(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition; read at scrape time from Valkey (no login: scrapers have none)."""
    return HttpResponse(metrics.render(), content_type=CONTENT_TYPE_LATEST)
