"""The admin's What-if panel: the group's recorded traffic replayed under the form's unsaved values.

The change forms of a group and of a pool post their current field values as ``pool.field=value``
changes (the same words as ``manage.py whatif --set``) with the minutes to replay; the answer is an
HTML fragment the page shows beside the form: per pool, predicted queue-wait percentiles, throughput,
peak queue depth and refusals for the saved and the edited configuration (and what history recorded),
a queue-depth chart per pool, and the fitted service model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.safestring import SafeString

from history.client import HistoryUnavailable
from history.svg import line_chart
from pools.models import FabricGroup
from pools.whatif import DEFAULT_MINUTES, MAX_MINUTES, group_whatif
from runtime.whatif.changes import BadChange
from runtime.whatif.compare import WhatIf
from runtime.whatif.engine import LEVELS, PoolOutcome
from runtime.whatif.trace import TraceTooLarge

TEMPLATE = "admin/pools/whatif_panel.html"


class WhatIfAdminMixin:
    """A ModelAdmin whose change form has the What-if aside (templates/admin/pools/change_form.html)."""

    def whatif_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        """Hook for the aside's URL (``whatif_url``) and the pool it is about (``whatif_pool``)."""
        return {}

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {**(extra_context or {}), **self.whatif_context(request, object_id)}
        return super().change_view(request, object_id, form_url, context)  # type: ignore[misc]


@dataclass(frozen=True)
class Side:
    """One row of a pool's table: recorded, current or proposed."""

    name: str
    waits: list[str]
    throughput: str = ""
    peak_depth: str = ""
    refused: str = ""
    unserved: str = ""


@dataclass(frozen=True)
class PoolPanel:
    pool_id: str
    sides: list[Side]
    chart: SafeString | str
    focus: bool


def _s(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _side(name: str, outcome: PoolOutcome | None) -> Side:
    if outcome is None:
        return Side(name, ["not in this configuration", "", ""])
    return Side(
        name,
        [_s(outcome.wait[level]) for level in LEVELS],
        f"{outcome.throughput_per_s:.2f}/s",
        str(outcome.peak_depth),
        str(outcome.refused),
        str(outcome.unserved),
    )


def _minutes(raw: str | None) -> float:
    try:
        minutes = float(raw) if raw else DEFAULT_MINUTES
    except ValueError:
        return DEFAULT_MINUTES
    return min(max(minutes, 1.0), MAX_MINUTES)


def panels(result: WhatIf, focus_pool: str | None) -> list[PoolPanel]:
    span = result.trace.end - result.trace.start
    out = []
    for pid, cur, prop, rec in result.rows():
        sides = []
        if rec is not None:
            sides.append(
                Side("recorded", [_s(rec.wait[level]) for level in LEVELS], refused=str(rec.refused))
            )
        sides.extend([_side("current", cur), _side("proposed", prop)])
        chart: SafeString | str = ""
        if cur is not None and prop is not None:
            chart = line_chart(
                [("current", cur.depth), ("proposed", prop.depth)],
                title=f"queue depth of {pid}, current against proposed",
                span_label=f"-{span / 60:.0f} min",
            )
        out.append(PoolPanel(pid, sides, chart, pid == focus_pool))
    if focus_pool:
        out.sort(key=lambda p: not p.focus)
    return out


def whatif_panel(request: HttpRequest, *, group: FabricGroup, focus_pool: str | None = None) -> HttpResponse:
    """Runs the What-if for the posted changes and renders the panel's fragment."""
    data = request.POST if request.method == "POST" else request.GET
    minutes = _minutes(data.get("minutes"))
    context: dict[str, object] = {"group": group, "minutes": minutes, "changes": data.getlist("set")}
    try:
        result = group_whatif(group=group, minutes=minutes, changes=data.getlist("set"))
    except BadChange as exc:
        context["error"] = f"This change cannot be replayed: {exc}"
    except TraceTooLarge as exc:
        context["error"] = str(exc)
    except HistoryUnavailable as exc:
        context["error"] = f"History is unavailable: {exc}"
    else:
        context.update(
            result=result,
            requests=len(result.trace),
            window_min=(result.trace.end - result.trace.start) / 60,
            panels=panels(result, focus_pool),
            fits=result.model_lines(),
        )
    return TemplateResponse(request, TEMPLATE, context)
