"""Producer keys: who may call the OpenAI-compatible ingress, into which pools, with which limits."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from pools.validation import validate_lane_id

# A share a million times another's is already "all of it"; the cap keeps counters in float range.
MAX_TENANT_WEIGHT = 1_000_000.0


def validate_pool_list(value: str) -> None:
    pools = [p.strip() for p in value.split(",") if p.strip()]
    if not pools:
        raise ValidationError("Name at least one pool.", code="no_pools")
    for pool_id in pools:
        validate_lane_id(pool_id)


class ProducerKey(models.Model):
    """An API key of the ingress. Only a SHA-256 of the key is stored: it is shown once, at creation."""

    name = models.CharField(
        max_length=100,
        unique=True,
        help_text="Recorded as the producer label in history (filter history by it).",
    )
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    key_prefix = models.CharField(
        max_length=16, editable=False, help_text="The key's first characters, to recognise it."
    )
    allowed_pools = models.CharField(
        max_length=1000,
        validators=[validate_pool_list],
        help_text="Comma-separated pool ids this key may use (X-Dispatch-Pool picks one).",
    )
    default_pool = models.CharField(
        max_length=63,
        blank=True,
        validators=[validate_lane_id],
        help_text="Pool of requests without X-Dispatch-Pool whose model is no alias; one of the allowed "
        "pools. Blank: such requests are refused (400), so every request names its pool or an alias.",
    )
    enabled = models.BooleanField(default=True, help_text="Untick to revoke the key (401 from then on).")
    max_in_flight = models.PositiveIntegerField(
        "most in flight",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Most open requests (queued or running) of this key over all web processes; more get 429.",
    )
    max_queued = models.PositiveIntegerField(
        "most queued",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Most requests of this key waiting to start, across every web process; more get 429.",
    )
    tenant_weight = models.FloatField(
        "tenant weight",
        default=1.0,
        help_text="Share of this key (tenant) inside a pool with tenant fairness, relative to the other "
        "keys: 2 gets twice the service of 1 while both wait.",
    )
    allow_sub_tenant = models.BooleanField(
        "allow sub-tenants",
        default=False,
        help_text="Let callers name a sub-tenant (the OpenAI 'user' field or an X-Dispatch-Tenant header), "
        "each shared fairly inside this key's pools. Off: the whole key is one tenant.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField("last used", null=True, blank=True, editable=False)

    class Meta:
        ordering = ("name",)
        verbose_name = "producer key"

    def __str__(self) -> str:
        return self.name

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.allowed_pools.split(",") if p.strip())

    def clean(self) -> None:
        super().clean()
        errors: dict[str, str] = {}
        if self.allowed_pools and self.default_pool and self.default_pool not in self.pools:
            errors["default_pool"] = "The default pool must be one of the allowed pools."
        weight = self.tenant_weight
        if weight is not None and not 0 < weight <= MAX_TENANT_WEIGHT:
            errors["tenant_weight"] = (
                f"The tenant weight must be above 0 and at most {MAX_TENANT_WEIGHT:g} (1 is an equal share)."
            )
        if errors:
            raise ValidationError(errors)
