"""Admin for producer keys: a new key is generated on save and shown once, in the page's message."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ingress import services
from ingress.models import ProducerKey


@admin.register(ProducerKey)
class ProducerKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "key_prefix", "allowed_pools", "default_pool", "enabled", "last_used_at")
    list_filter = ("enabled",)
    search_fields = ("name", "key_prefix")
    readonly_fields = ("key_prefix", "created_at", "last_used_at")
    fields = (
        "name",
        "key_prefix",
        "allowed_pools",
        "default_pool",
        "enabled",
        "max_in_flight",
        "max_queued",
        "tenant_weight",
        "allow_sub_tenant",
        "created_at",
        "last_used_at",
    )
    actions = ("revoke",)

    def save_model(self, request: HttpRequest, obj: ProducerKey, form: Any, change: bool) -> None:
        if not change:
            raw_key = services.new_raw_key()
            services.producer_key_set_secret(key=obj, raw_key=raw_key)
            super().save_model(request, obj, form, change)
            messages.warning(
                request,
                f"The key of “{obj.name}” is {raw_key} — copy it now: it is not stored and "
                f"will not be shown again.",
            )
            return
        super().save_model(request, obj, form, change)

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ProducerKey]) -> None:
        for key in queryset:
            services.producer_key_revoke(key=key)
        messages.info(
            request, f"{queryset.count()} key(s) revoked; the ingress refuses them within a second."
        )
