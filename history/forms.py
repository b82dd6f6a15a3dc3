"""The history filter forms (GET)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django import forms

from history.queries import STATUSES, ExecutionFilter

WINDOWS = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(days=1),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
_DT_FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"]


class ExecutionFilterForm(forms.Form):
    group = forms.CharField(required=False, max_length=200)
    pool = forms.CharField(required=False, max_length=200)
    producer = forms.CharField(required=False, max_length=200)
    gateway = forms.CharField(required=False, max_length=200)
    status = forms.ChoiceField(required=False, choices=[("", "any"), *((s, s) for s in STATUSES)])
    error_type = forms.CharField(required=False, max_length=200)
    model = forms.CharField(required=False, max_length=200)
    since = forms.DateTimeField(
        required=False,
        input_formats=_DT_FORMATS,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    until = forms.DateTimeField(
        required=False,
        input_formats=_DT_FORMATS,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    page = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def to_filter(self) -> ExecutionFilter:
        data = self.cleaned_data if self.is_valid() else {}
        return ExecutionFilter(
            **{
                k: data.get(k) or ""
                for k in ("group", "pool", "producer", "gateway", "status", "error_type", "model")
            },
            since=data.get("since"),
            until=data.get("until"),
        )

    def page_number(self) -> int:
        return (self.cleaned_data.get("page") if self.is_valid() else None) or 1


class AnalyticsForm(forms.Form):
    window = forms.ChoiceField(required=False, choices=[(k, k) for k in WINDOWS], initial="1h")
    group = forms.CharField(required=False, max_length=200)

    def span(self) -> tuple[str, datetime, datetime]:
        data = self.cleaned_data if self.is_valid() else {}
        window = data.get("window") or "1h"
        until = datetime.now(UTC)
        return window, until - WINDOWS[window], until

    def group_id(self) -> str:
        return (self.cleaned_data.get("group") if self.is_valid() else "") or ""
