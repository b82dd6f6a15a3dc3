"""Admin for fabric groups (with their pools and model aliases inline) and for pools."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from pools import selectors, services
from pools.admin import whatif as whatif_views
from pools.admin.dead_letters import DeadLettersAdminMixin
from pools.admin.publication import report_publication
from pools.forms import FabricGroupForm, PoolChangelistFormSet, PoolInlineFormSet, PoolRowForm
from pools.models import FabricGroup, ModelAlias, Pool
from runtime.backends.redact import redact_url


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
        # Tenant fairness is set on the pool's own page: two more columns made the group page 1600 px wide.
        "enabled",
        "paused",
        "sort_order",
    )
    ordering = ("sort_order", "pool_id")


class ModelAliasInline(admin.TabularInline):
    """The group's model aliases: a request's ``model`` that picks a pool, for clients without headers."""

    model = ModelAlias
    extra = 0
    fields = ("alias", "pool", "backend_model")
    ordering = ("alias",)
    verbose_name_plural = "model aliases (a request whose model is an alias goes to its pool, no header)"

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "pool":  # only this group's pools (saved ones: a new pool row has no id yet)
            object_id = request.resolver_match.kwargs.get("object_id") if request.resolver_match else None
            kwargs["queryset"] = Pool.objects.filter(group_id=object_id).order_by("sort_order", "pool_id")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(FabricGroup)
class FabricGroupAdmin(whatif_views.WhatIfAdminMixin, admin.ModelAdmin):
    form = FabricGroupForm
    inlines = (PoolInline, ModelAliasInline)
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
        if formset.model is not Pool:  # aliases: published with the pools, in save_related
            formset.save()
            return
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
class PoolAdmin(DeadLettersAdminMixin, whatif_views.WhatIfAdminMixin, admin.ModelAdmin):
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
