"""Admin for backends, fabric groups and pools. Writes go through pools.services, reads through
pools.selectors; once the admin's transaction commits, the affected groups are republished to
Valkey, and a failed publication is shown as a warning (the database write stands)."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from pools import selectors, services, whatif_views
from pools.connections import VALKEY_ERRORS
from pools.forms import FabricGroupForm, PoolChangelistFormSet, PoolInlineFormSet, PoolRowForm
from pools.models import Backend, FabricGroup, Pool
from runtime.backends.redact import redact_url

REPUBLISH_HINT = (
    "Running dispatchers keep their previous configuration; "
    "run `manage.py pools_publish` once Valkey is back."
)


def report_publication(request: HttpRequest, results: list[services.PublishResult]) -> None:
    """One message per published group, once the admin's transaction has committed and published.

    ``results`` is the list a service fills at commit; this hook is registered after the service's,
    and commit hooks run in registration order, so it reads the list filled.
    """
    transaction.on_commit(lambda: _report_results(request, results))


def _report_results(request: HttpRequest, results: list[services.PublishResult]) -> None:
    """Info when the configuration reached Valkey, a warning when it did not."""
    for result in results:
        if result.ok and result.unpublished:
            messages.info(request, f"Group “{result.group_id}” removed from its dispatchers' configuration.")
        elif result.ok:
            messages.info(
                request,
                f"Configuration of group “{result.group_id}” published to its dispatchers "
                f"(version {result.version}).",
            )
        else:
            messages.warning(
                request,
                f"Saved, but the configuration of group “{result.group_id}” was not published: "
                f"{result.error}. "
                f"{REPUBLISH_HINT}",
            )


def _when(timestamp: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)


class PoolInlineRowForm(PoolRowForm):
    """A row of the group page's pool inline: an existing pool's id is shown but fixed.

    The admin's read-only fields apply to every row of an inline, so the id is disabled per row
    instead: new rows still take an id, and a posted id for an existing row is ignored.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            # Renaming a lane would strand its queued requests under the old key (as on PoolAdmin).
            self.fields["pool_id"].disabled = True


class PoolInline(admin.TabularInline):
    model = Pool
    form = PoolInlineRowForm
    formset = PoolInlineFormSet
    extra = 0
    fields = (
        "pool_id",
        "display_name",
        "quantum",
        "min_concurrent",
        "max_concurrent",
        "max_burst_per_visit",
        "backend",
        "max_queued",
        "max_queue_wait_s",
        "tenant_fairness",
        "max_queued_per_tenant",
        "enabled",
        "paused",
        "sort_order",
    )
    ordering = ("sort_order", "pool_id")


@admin.register(FabricGroup)
class FabricGroupAdmin(whatif_views.WhatIfAdminMixin, admin.ModelAdmin):
    form = FabricGroupForm
    inlines = (PoolInline,)
    list_display = (
        "group_id",
        "name",
        "policy",
        "total_concurrency",
        "pool_count",
        "queueing_enabled",
        "delivery",
        "endpoint",
    )
    list_filter = ("policy", "queueing_enabled", "delivery")
    search_fields = ("group_id", "name")
    actions = ("publish_groups",)

    def get_readonly_fields(self, request: HttpRequest, obj: FabricGroup | None = None) -> tuple[str, ...]:
        # A new id would be a new group: dispatchers run with --group <id>.
        return ("group_id", "updated_at") if obj else ("updated_at",)

    @admin.display(description="pools")
    def pool_count(self, obj: FabricGroup) -> int:
        return selectors.group_pools(group=obj).count()

    @admin.display(description="default backend")
    def endpoint(self, obj: FabricGroup) -> str:
        return f"{obj.backend_id} ({redact_url(obj.backend.base_url)})" if obj.backend else "—"

    def save_model(self, request: HttpRequest, obj: FabricGroup, form: Any, change: bool) -> None:
        services.group_save(group=obj, publish=False)  # published in save_related, with its pools

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        pools = formset.save(commit=False)
        for pool in formset.deleted_objects:
            services.pool_delete(pool=pool, publish=False)
        for pool in pools:
            services.pool_save(pool=pool, publish=False)
        formset.save_m2m()

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        report_publication(request, services.publish_on_commit(group_ids=[form.instance.group_id]))

    def delete_model(self, request: HttpRequest, obj: FabricGroup) -> None:
        report_publication(request, services.group_delete(group=obj))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[FabricGroup]) -> None:
        for group in queryset:
            report_publication(request, services.group_delete(group=group))

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.whatif_view)
        return [path("<path:object_id>/whatif/", view, name="pools_fabricgroup_whatif"), *super().get_urls()]

    def whatif_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        return {"whatif_url": reverse("admin:pools_fabricgroup_whatif", args=[object_id])}

    def whatif_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The What-if panel of the group's page: its recorded traffic under the form's values."""
        group = get_object_or_404(FabricGroup, pk=object_id)
        if not self.has_view_permission(request, group):
            raise PermissionDenied
        return whatif_views.whatif_panel(request, group=group)

    @admin.action(description="Publish selected groups to their dispatchers")
    def publish_groups(self, request: HttpRequest, queryset: QuerySet[FabricGroup]) -> None:
        report_publication(request, [services.group_publish(group=group) for group in queryset])


@admin.register(Pool)
class PoolAdmin(whatif_views.WhatIfAdminMixin, admin.ModelAdmin):
    list_display = (
        "pool_id",
        "display_name",
        "group",
        "quantum",
        "min_concurrent",
        "max_concurrent",
        "max_burst_per_visit",
        "state",
        "queued",
        "sort_order",
    )
    list_editable = ("quantum", "min_concurrent", "max_concurrent", "max_burst_per_visit")
    list_filter = ("group", "enabled", "paused")
    search_fields = ("pool_id", "display_name")
    list_select_related = ("group", "backend")
    actions = ("pause_pools", "resume_pools")

    def get_readonly_fields(self, request: HttpRequest, obj: Pool | None = None) -> tuple[str, ...]:
        # Renaming a lane would strand its queued requests under the old key.
        return ("pool_id", "updated_at") if obj else ("updated_at",)

    def get_changelist_formset(self, request: HttpRequest, **kwargs: Any) -> Any:
        return super().get_changelist_formset(request, formset=PoolChangelistFormSet, **kwargs)

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        return super().get_changelist_form(request, form=PoolRowForm, **kwargs)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)  # evaluated once; the page renders these same objects
        lengths = selectors.pool_queue_lengths(pool_ids=[p.pool_id for p in rows])
        dead = selectors.pool_dead_letter_counts(pool_ids=[p.pool_id for p in rows])
        for pool in rows:
            pool.queued_count = lengths.get(pool.pool_id)
            pool.dead_count = dead.get(pool.pool_id)
        return changelist

    @admin.display(description="state")
    def state(self, obj: Pool) -> str:
        if not obj.enabled:
            return format_html('<span style="color:#777">{}</span>', "● disabled")
        if obj.paused:
            return format_html(
                '<span style="background:#f5a623;color:#000;padding:1px 6px;border-radius:8px;'
                'font-weight:bold" title="{}">{}</span>',
                "Paused: queued work stays queued until resumed",
                "❚❚ PAUSED",  # U+23F8 (⏸) has no glyph in Debian's fonts: Chromium drew a box
            )
        return format_html('<span style="color:#1a7f37">{}</span>', "● running")

    @admin.display(description="queued")
    def queued(self, obj: Pool) -> str:
        """Queued requests, and under them a link to the pool's dead letters when it has any."""
        count = getattr(obj, "queued_count", None)
        queued = "?" if count is None else str(count)
        dead = getattr(obj, "dead_count", None)
        if not dead:
            return queued
        url = reverse("admin:pools_pool_dead_letters", args=[obj.pk])
        return format_html('{}<br><a href="{}" class="dead-letters-link">{} dead</a>', queued, url, dead)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.dead_letters_view)
        whatif = self.admin_site.admin_view(self.whatif_view)
        return [
            path("<int:object_id>/dead-letters/", view, name="pools_pool_dead_letters"),
            path("<int:object_id>/whatif/", whatif, name="pools_pool_whatif"),
            *super().get_urls(),
        ]

    def whatif_context(self, request: HttpRequest, object_id: str) -> dict[str, Any]:
        pool = self.get_object(request, object_id)
        if pool is None:
            return {}
        return {"whatif_url": reverse("admin:pools_pool_whatif", args=[pool.pk]), "whatif_pool": pool.pool_id}

    def whatif_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """The What-if panel of the pool's page: its group's traffic, this pool's rows first."""
        pool = get_object_or_404(Pool, pk=object_id)
        if not self.has_view_permission(request, pool):
            raise PermissionDenied
        return whatif_views.whatif_panel(request, group=pool.group, focus_pool=pool.pool_id)

    def dead_letters_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """Lists a pool's dead letters; a POST replays or discards one and records it in the log."""
        pool = get_object_or_404(Pool, pk=object_id)
        if not self.has_view_permission(request, pool):
            raise PermissionDenied
        if request.method == "POST":
            if not self.has_change_permission(request, pool):
                raise PermissionDenied
            self._act_on_dead_letter(request, pool)
            return redirect(request.path)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Dead letters of {pool.pool_id}",
            "pool": pool,
            "opts": self.opts,
        }
        try:
            context["letters"] = [
                {
                    "letter": stored.letter,
                    "digest": stored.digest,
                    "raw_size": len(stored.raw),
                    "dead_at": _when(stored.letter.dead_at) if stored.letter else None,
                }
                for stored in selectors.pool_dead_letters(pool=pool)
            ]
        except VALKEY_ERRORS as exc:
            context["unavailable"] = str(exc) or exc.__class__.__name__
        return TemplateResponse(request, "admin/pools/pool/dead_letters.html", context)

    def _act_on_dead_letter(self, request: HttpRequest, pool: Pool) -> None:
        action, digest = request.POST.get("action"), request.POST.get("letter", "")
        if action == "replay":
            result = services.dead_letter_replay(pool=pool, digest=digest)
        elif action == "discard":
            result = services.dead_letter_discard(pool=pool, digest=digest)
        else:
            messages.error(request, f"Unknown dead-letter action {action!r}.")
            return
        what = f"request {result.request_id}" if result.request_id else "an unreadable item"
        if not result.done:
            messages.warning(request, f"Nothing to {action}: {result.error}.")
            return
        done = "Replayed" if action == "replay" else "Discarded"
        self.log_change(request, pool, f"{done} dead letter {what}")
        messages.success(request, f"{done} dead letter {what} of pool {pool.pool_id}.")

    def save_model(self, request: HttpRequest, obj: Pool, form: Any, change: bool) -> None:
        report_publication(request, services.pool_save(pool=obj))

    def delete_model(self, request: HttpRequest, obj: Pool) -> None:
        report_publication(request, services.pool_delete(pool=obj))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Pool]) -> None:
        group_ids = {pool.group_id for pool in queryset}
        for pool in queryset:
            services.pool_delete(pool=pool, publish=False)
        report_publication(request, services.publish_on_commit(group_ids=group_ids))

    @admin.action(description="Pause selected pools")
    def pause_pools(self, request: HttpRequest, queryset: QuerySet[Pool]) -> None:
        results = services.pool_set_paused(pools=queryset, paused=True)
        messages.success(request, f"Paused {queryset.count()} pool(s); their queued work stays queued.")
        report_publication(request, results)

    @admin.action(description="Resume selected pools")
    def resume_pools(self, request: HttpRequest, queryset: QuerySet[Pool]) -> None:
        results = services.pool_set_paused(pools=queryset, paused=False)
        messages.success(request, f"Resumed {queryset.count()} pool(s).")
        report_publication(request, results)


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
