"""Staff-only history pages: recent executions, one request's detail, per-pool analytics.

ClickHouse being unreachable renders the page with a clear message (HTTP 503), never a traceback.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from history import queries, schema, svg
from history.client import HistoryUnavailable, history_client
from history.forms import WINDOWS, AnalyticsForm, ExecutionFilterForm
from history.tenants import TENANT_LIMIT, tenant_usage

log = logging.getLogger(__name__)
PAGE_SIZE = 50


def _unavailable(
    request: HttpRequest, template: str, context: dict[str, Any], exc: Exception
) -> HttpResponse:
    log.warning("history view: %s", exc)
    context["unavailable"] = str(exc)
    return render(request, template, context, status=503)


@staff_member_required
def recent(request: HttpRequest) -> HttpResponse:
    form = ExecutionFilterForm(request.GET or None)
    context: dict[str, Any] = {"form": form, "nav": "recent"}
    try:
        client = history_client()
        filters = form.to_filter()
        page = queries.executions_recent(
            client=client, filters=filters, page=form.page_number(), page_size=PAGE_SIZE
        )
        context["choices"] = queries.filter_choices(client=client, since=filters.since)
        # An empty bounded window: say whether anything is stored at all, so the operator can widen it.
        context["any_stored"] = bool(page.rows) or queries.executions_exist(client=client)
    except HistoryUnavailable as exc:
        return _unavailable(request, "history/recent.html", context, exc)
    params = {k: v for k, v in request.GET.items() if k != "page" and v}
    context.update(
        page=page,
        prev_query=urlencode({**params, "page": page.page - 1}),
        next_query=urlencode({**params, "page": page.page + 1}),
        filtered=bool({k for k in params if k != "window"}),
        window=form.window_name(),
        since=filters.since,
    )
    return render(request, "history/recent.html", context)


@staff_member_required
def detail(request: HttpRequest, request_id: str) -> HttpResponse:
    context: dict[str, Any] = {"request_id": request_id, "nav": "recent"}
    try:
        found = queries.execution_detail(client=history_client(), request_id=request_id)
    except HistoryUnavailable as exc:
        return _unavailable(request, "history/detail.html", context, exc)
    if found is None:
        return render(request, "history/detail.html", context, status=404)
    execution = found["execution"]
    context.update(found)
    context["attributes"] = sorted(
        next((s["attributes"] for s in found["trace"] if s["span_id"] == execution["span_id"]), {}).items()
    )
    return render(request, "history/detail.html", context)


def _stream_status() -> dict[str, int | None] | None:
    try:
        from pools import connections

        return queries.stream_status(connections.sync_client(), connections.key_space())
    except Exception as exc:  # Valkey unreachable: the page still renders ClickHouse's part
        log.warning("history view: span stream status unavailable: %s", exc)
        return None


@staff_member_required
def pools(request: HttpRequest) -> HttpResponse:
    form = AnalyticsForm(request.GET or None)
    window, since, until = form.span()
    context: dict[str, Any] = {
        "form": form,
        "nav": "pools",
        "window": window,
        "windows": list(WINDOWS),
        "group": form.group_id(),
        "since": since,
        "until": until,
        "stream": _stream_status(),
    }
    try:
        client = history_client()
        stats = queries.pool_analytics(
            client=client, since=since, until=until, group=form.group_id(), exact=form.exact_mode()
        )
        tenants = tenant_usage(client=client, since=since, until=until, group=form.group_id())
    except HistoryUnavailable as exc:
        return _unavailable(request, "history/pools.html", context, exc)
    series = ("p50", "p95", "p99")
    charts = []
    for title, attr in (("Queue wait", "queue_wait"), ("Execution", "execution"), ("Total latency", "total")):
        rows = [(s.pool, [getattr(s, attr)[lvl] for lvl in queries.LEVELS]) for s in stats]
        charts.append({"title": title, "svg": svg.bar_chart(rows, series=series, title=title)})
    if stats:
        rate_rows = [(s.pool, [s.error_rate]) for s in stats]
        charts.append(
            {
                "title": "Error rate",
                "svg": svg.bar_chart(rate_rows, series=("errors",), unit="%", title="Error rate"),
            }
        )
        tps_rows = [(s.pool, [s.tokens_per_s]) for s in stats]
        charts.append(
            {
                "title": "Output tokens per second",
                "svg": svg.bar_chart(tps_rows, series=("tokens/s",), unit="", title="Tokens per second"),
            }
        )
    context.update(
        stats=[{"s": s, "spark": svg.sparkline(s.timeline)} for s in stats],
        charts=charts,
        levels=queries.LEVELS,
        tenants=tenants,
        tenant_limit=TENANT_LIMIT,
        exact=form.exact_mode(),
        accuracy_pct=f"{schema.STATED_ACCURACY * 100:g}",
    )
    return render(request, "history/pools.html", context)
