"""The history filter forms (GET)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django import forms

from history.queries import EXACT_MAX_WINDOW, STATUSES, ExecutionFilter

WINDOWS = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(days=1),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
RECENT_DEFAULT_WINDOW = "1h"
_DT_FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"]


class ExecutionFilterForm(forms.Form):
    window = forms.ChoiceField(
        required=False,
        choices=[*((k, f"last {k}") for k in WINDOWS), ("all", "all history")],
        initial=RECENT_DEFAULT_WINDOW,
        help_text="ignored when 'since' is set",
    )
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
            since=self.lower_bound(),
            until=data.get("until"),
        )

    def window_name(self) -> str:
        return (self.cleaned_data.get("window") if self.is_valid() else None) or RECENT_DEFAULT_WINDOW

    def lower_bound(self) -> datetime | None:
        """The list's lower time bound: ``since`` when given, else the window's start (None: all)."""
        explicit = self.cleaned_data.get("since") if self.is_valid() else None
        if explicit is not None:
            return explicit  # type: ignore[no-any-return]
        window = self.window_name()
        return None if window == "all" else datetime.now(UTC) - WINDOWS[window]

    def page_number(self) -> int:
        return (self.cleaned_data.get("page") if self.is_valid() else None) or 1


class AnalyticsForm(forms.Form):
    window = forms.ChoiceField(required=False, choices=[(k, k) for k in WINDOWS], initial="1h")
    group = forms.CharField(required=False, max_length=200)
    exact = forms.BooleanField(required=False, label="exact percentiles")

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        if data.get("exact") and WINDOWS[data.get("window") or "1h"] > EXACT_MAX_WINDOW:
            self.add_error("exact", "Exact percentiles are offered for windows up to 1h.")
        return data

    def _valid_fields(self) -> dict[str, object]:
        """The fields that passed validation: a refused ``exact`` keeps the chosen window."""
        self.is_valid()
        return getattr(self, "cleaned_data", {})

    def exact_mode(self) -> bool:
        return bool(self._valid_fields().get("exact"))

    def span(self) -> tuple[str, datetime, datetime]:
        window = str(self._valid_fields().get("window") or "1h")
        until = datetime.now(UTC)
        return window, until - WINDOWS[window], until

    def group_id(self) -> str:
        return str(self._valid_fields().get("group") or "")
