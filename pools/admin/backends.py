"""Admin for backends: settings beside live load, and the "Test connection" page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from pools import selectors, services
from pools.admin.publication import report_publication
from pools.models import Backend
from runtime.backends.redact import redact_url


@admin.register(Backend)
class BackendAdmin(admin.ModelAdmin):
    """Backends with their live load (read from Valkey) next to their settings, and a "Test connection"
    button on a backend's page that reads its models and metrics once and shows what it read."""

    change_form_template = "admin/pools/backend/change_form.html"

    list_display = (
        "backend_id",
        "name",
        "address",
        "kind",
        "max_in_flight",
        "load_gating",
        "max_waiting",
        "max_kv_cache_usage",
        "live_load",
    )
    list_filter = ("kind", "load_gating")
    search_fields = ("backend_id", "name", "base_url")
    fieldsets = (
        (None, {"fields": ("backend_id", "name", "base_url", "api_key_env", "kind", "live_load")}),
        ("Capacity and timeouts", {"fields": ("max_in_flight", "timeout_s", "connect_timeout_s")}),
        (
            "Load gating",
            {
                "fields": (
                    "load_gating",
                    "metrics_url",
                    "max_waiting",
                    "max_kv_cache_usage",
                    "metrics_max_age_s",
                    "metrics_timeout_s",
                    "metrics_max_bytes",
                )
            },
        ),
        ("Circuit breaker", {"fields": ("breaker_failures", "breaker_open_s", "breaker_probes")}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Backend | None = None) -> tuple[str, ...]:
        # A new id would be a new backend: its shared load, breaker and in-flight count live under it.
        return ("backend_id", "live_load", "updated_at") if obj else ("live_load", "updated_at")

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        live = selectors.backend_live(backends=rows)
        for backend in rows:
            backend.live = live.get(backend.backend_id)
        return changelist

    @admin.display(description="address")
    def address(self, obj: Backend) -> str:
        return redact_url(obj.base_url)

    @admin.display(description="live load")
    def live_load(self, obj: Backend) -> str:
        if obj.pk is None:
            return "—"
        live = getattr(obj, "live", None) or selectors.backend_live(backends=[obj]).get(obj.backend_id)
        if live is None:
            return "Valkey unreachable"
        return live.describe()

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.test_connection_view)
        return [
            path("<path:object_id>/test-connection/", view, name="pools_backend_test_connection"),
            *super().get_urls(),
        ]

    def test_connection_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: fetches the saved backend's /v1/models and metrics once and shows what was read."""
        backend = get_object_or_404(Backend, pk=object_id)
        if not self.has_change_permission(request, backend):
            raise PermissionDenied
        if request.method != "POST":  # it calls out to the backend: only on the button's POST
            return redirect(reverse("admin:pools_backend_change", args=[backend.pk]))
        result = selectors.backend_test_connection(backend=backend)
        key_env = backend.api_key_env
        context = {
            **self.admin_site.each_context(request),
            "title": f"Test connection: {backend}",
            "backend": backend,
            "result": result,
            "kind_label": backend.get_kind_display(),
            "key_missing": bool(key_env) and not result.key_sent,
            "opts": self.opts,
        }
        return TemplateResponse(request, "admin/pools/backend/test_connection.html", context)

    def save_model(self, request: HttpRequest, obj: Backend, form: Any, change: bool) -> None:
        report_publication(request, services.backend_save(backend=obj))

    def delete_model(self, request: HttpRequest, obj: Backend) -> None:
        services.backend_delete(backend=obj)
