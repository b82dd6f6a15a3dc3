"""Backends, fabric groups and their pools (lanes): the source of truth that is published to dispatchers."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from pools.model_aliases import ModelAlias
from pools.validation import (
    backend_value_errors,
    group_problems,
    pool_value_errors,
    pool_values,
    validate_endpoint_url,
    validate_env_name,
    validate_lane_id,
)


class Backend(models.Model):
    """An OpenAI-compatible server that pools and groups send their calls to, shared by all of them."""

    class Kind(models.TextChoices):
        # One line each: what the admin's kind menu says, and which gauges gating reads.
        VLLM = "vllm", "vLLM: vllm:num_requests_running / _waiting, KV-cache usage (0.10+ or older name)"
        SGLANG = "sglang", "SGLang: sglang:num_running_reqs / num_queue_reqs / token_usage"
        LLAMACPP = (
            "llamacpp",
            (
                "llama.cpp llama-server (--metrics): llamacpp:requests_processing / requests_deferred, "
                "kv_cache_usage_ratio if sent"
            ),
        )
        TGI = "tgi", "Hugging Face TGI: tgi_batch_current_size / tgi_queue_size (no KV-cache gauge)"
        OPENAI = "openai", "OpenAI-compatible, no load metrics (Ollama, a hosted API): max in flight, 429s"

    backend_id = models.CharField(
        "backend id",
        primary_key=True,
        max_length=63,
        validators=[validate_lane_id],
        help_text="Stable id used in Valkey keys (shared load, breaker, in-flight count).",
    )
    name = models.CharField("display name", max_length=200, blank=True)
    base_url = models.CharField(
        "base URL",
        max_length=500,
        validators=[validate_endpoint_url],
        help_text="OpenAI-compatible base URL, e.g. http://127.0.0.1:8100/v1. No credentials in the URL.",
    )
    api_key_env = models.CharField(
        "API key environment variable",
        max_length=100,
        blank=True,
        validators=[validate_env_name],
        help_text="NAME of the environment variable holding the backend API key (e.g. OPENAI_API_KEY), "
        "never the key itself.",
    )
    kind = models.CharField(
        max_length=8,
        choices=Kind.choices,
        default=Kind.VLLM,
        help_text="The serving engine, so gating reads its own load gauges from its metrics. "
        "'OpenAI-compatible' has none: max in flight holds, and a 429's Retry-After holds its pools.",
    )
    max_in_flight = models.PositiveIntegerField(
        "max in flight",
        default=64,
        help_text="Cap on calls in flight to this backend across every pool, group and dispatcher.",
    )
    timeout_s = models.FloatField(
        "call timeout (s)",
        default=120.0,
        help_text="Upper bound of one call (the request deadline bounds it too).",
    )
    connect_timeout_s = models.FloatField("connect timeout (s)", default=5.0)
    metrics_url = models.CharField(
        "metrics URL",
        max_length=500,
        blank=True,
        validators=[validate_endpoint_url],
        help_text="Prometheus metrics of the server; empty: the base URL's server at /metrics.",
    )
    load_gating = models.BooleanField(
        "load gating",
        default=True,
        help_text="Hold work in our queues while the backend is saturated (needs a kind with load metrics).",
    )
    max_waiting = models.PositiveIntegerField(
        "max waiting",
        default=5,
        help_text="Saturated when this many requests wait in the backend's own queue.",
    )
    max_kv_cache_usage = models.FloatField(
        "max KV-cache usage", default=0.8, help_text="Saturated at this KV-cache usage (0 to 1)."
    )
    metrics_max_age_s = models.FloatField(
        "metrics max age (s)",
        default=1.0,
        help_text="Older metrics are stale: gating falls back to max in flight alone.",
    )
    metrics_timeout_s = models.FloatField(
        "metrics timeout (s)",
        default=1.0,
        help_text="Time budget of one whole scrape of the metrics, from connecting to the last byte; "
        "a slower scrape counts as unreachable.",
    )
    metrics_max_bytes = models.PositiveIntegerField(
        "metrics max size (bytes)",
        default=1 << 20,
        help_text="A larger metrics body is refused unread (a vLLM or SGLang server sends a few dozen KB).",
    )
    breaker_failures = models.PositiveIntegerField(
        "breaker: failures to open",
        default=5,
        help_text="Retryable failures within 30 s that open the breaker.",
    )
    breaker_open_s = models.FloatField(
        "breaker: open for (s)", default=10.0, help_text="How long calls are held before a probe."
    )
    breaker_probes = models.PositiveIntegerField(
        "breaker: probes",
        default=1,
        help_text="Calls let through at once, fleet-wide, once the open time is over; when all of them "
        "succeed the breaker closes, when one fails it opens again.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("backend_id",)

    def __str__(self) -> str:
        return self.name or self.backend_id

    def clean(self) -> None:
        super().clean()
        errors = backend_value_errors({f.name: getattr(self, f.name) for f in self._meta.concrete_fields})
        if errors:
            raise ValidationError(errors)


class FabricGroup(models.Model):
    """A set of pools scheduled together by the dispatchers of one group, under one concurrency total."""

    class Policy(models.TextChoices):
        DRR = "drr", "Deficit Round Robin (weighted)"
        FIFO = "fifo", "FIFO (arrival order)"

    class Delivery(models.TextChoices):
        LISTS = "lists", "lists: at most once (a claimed request whose dispatcher dies is lost, and counted)"
        DURABLE = "durable", "durable: at least once (a dead dispatcher's requests run again)"

    class CostMode(models.TextChoices):
        UNITS = "units", "units: cost_units, else 1 + 2 per image + 1 per page"
        TOKENS = "tokens", "tokens: estimated prompt + output tokens, weighted by the pool's token weights"

    group_id = models.CharField(
        "group id",
        primary_key=True,
        max_length=63,
        validators=[validate_lane_id],
        help_text="Stable id used by dispatchers (rundispatcher --group) and in Valkey keys.",
    )
    name = models.CharField(max_length=200, blank=True)
    policy = models.CharField(max_length=8, choices=Policy.choices, default=Policy.DRR)
    queueing_enabled = models.BooleanField(
        default=True,
        help_text="When off, producers call the group's endpoint directly (no queue, no fair scheduling); "
        "its dispatchers only drain requests queued before the switch.",
    )
    backend = models.ForeignKey(
        Backend,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="groups",
        verbose_name="default backend",
        help_text="Backend of the pools that name none.",
    )
    delivery = models.CharField(
        max_length=8,
        choices=Delivery.choices,
        default=Delivery.LISTS,
        help_text="durable: the claim keeps the request with its lease; when the lease expires the "
        "request goes back to the head of its pool. A backend may then see it twice; its producer gets "
        "one reply.",
    )
    persist_replicas = models.PositiveSmallIntegerField(
        default=0,
        help_text="durable: replicas that must hold a request (Valkey WAIT/WAITAOF) before its producer "
        "is answered, on top of the primary's own fsync. 0 without replicas.",
    )
    total_concurrency = models.PositiveIntegerField(
        default=16,
        validators=[MinValueValidator(1, "Total concurrency must be at least 1.")],
        help_text="Group-wide cap on in-flight calls, across all dispatchers of the group.",
    )
    cost_mode = models.CharField(
        "DRR cost",
        max_length=8,
        choices=CostMode.choices,
        default=CostMode.UNITS,
        help_text="What a request costs its pool's DRR credit between pools.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    # Set by admin forms whose formset checks the group rules with the submitted pool values.
    skip_group_check = False

    class Meta:
        ordering = ("group_id",)
        verbose_name = "fabric group"

    def __str__(self) -> str:
        return self.name or self.group_id

    def clean(self) -> None:
        super().clean()
        if self.skip_group_check or self._state.adding or not self.total_concurrency:
            return
        pools = [pool_values(p) for p in self.pools.all()]
        problems = group_problems(policy=self.policy, total_concurrency=self.total_concurrency, pools=pools)
        if problems:
            raise ValidationError(problems)


class Pool(models.Model):
    """One lane of a group: producers push to ``list:llm:requests:{pool_id}``."""

    class TenantFairness(models.TextChoices):
        OFF = "off", "off: first come, first served inside the pool"
        REQUESTS = "requests", "requests: every request of a tenant costs 1"
        TOKENS = "tokens", "tokens: input and output tokens, weighted"

    group = models.ForeignKey(FabricGroup, on_delete=models.CASCADE, related_name="pools")
    pool_id = models.CharField(
        "pool id",
        max_length=63,
        unique=True,
        validators=[validate_lane_id],
        error_messages={"unique": "A pool with this id already exists (pool ids are global lane ids)."},
        help_text="Stable lane id producers select; the queue is list:llm:requests:{pool id}.",
    )
    display_name = models.CharField(max_length=200, blank=True)
    quantum = models.PositiveIntegerField(
        "Weight", default=1, help_text="Relative dispatch credit, not a concurrency limit"
    )
    min_concurrent = models.PositiveIntegerField(
        "min concurrent", default=0, help_text="Protected running slots while the pool has backlog"
    )
    max_concurrent = models.PositiveIntegerField(
        "max concurrent", default=8, help_text="Hard in-flight cap across all dispatchers"
    )
    max_burst_per_visit = models.PositiveIntegerField(
        "max burst per visit", default=1, help_text="Most requests launched per scheduler visit"
    )
    backend = models.ForeignKey(
        Backend,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="pools",
        help_text="Optional; empty uses the group's default backend.",
    )
    max_queued = models.PositiveIntegerField(
        "max queued",
        null=True,
        blank=True,
        help_text="Admission: submits are refused (QueueFull) while this many wait. Blank: unbounded.",
    )
    max_queue_wait_s = models.FloatField(
        "max queue wait (s)",
        null=True,
        blank=True,
        help_text="Admission: refuse when the estimated wait (queue length / recent drain rate) exceeds it.",
    )
    enabled = models.BooleanField(
        default=True, help_text="Disabled pools are removed from the pool registry: submits are refused."
    )
    paused = models.BooleanField(
        default=False, help_text="Paused pools keep their queued work; nothing is dispatched until resumed."
    )
    max_attempts = models.PositiveIntegerField(
        "max attempts",
        default=1,
        validators=[MinValueValidator(1, "A request gets at least one attempt.")],
        help_text="Attempts per request (1 = no retry); only connection errors, timeouts, 429, 5xx retry.",
    )
    retry_backoff_base_s = models.FloatField(
        "retry backoff base (s)",
        default=0.5,
        validators=[MinValueValidator(0.0)],
        help_text="First retry waits up to this long (full jitter), doubling per attempt to the cap.",
    )
    retry_backoff_cap_s = models.FloatField(
        "retry backoff cap (s)",
        default=30.0,
        validators=[MinValueValidator(0.0)],
        help_text="Longest pause between attempts (a backend's Retry-After may ask for more).",
    )
    max_requeues = models.PositiveIntegerField(
        "max requeues",
        default=3,
        help_text="Durable groups: times an expired lease puts a request back before it is a dead letter.",
    )
    tenant_fairness = models.CharField(
        "tenant fairness",
        max_length=8,
        choices=TenantFairness.choices,
        default=TenantFairness.OFF,
        help_text="Fairness between the tenants (producer keys, or a key's sub-tenants) inside this pool's "
        "share: off keeps first come, first served.",
    )
    tenant_input_weight = models.FloatField(
        "tenant input weight",
        default=1.0,
        help_text="tokens mode: what one prompt token costs a tenant.",
    )
    tenant_output_weight = models.FloatField(
        "tenant output weight",
        default=4.0,
        help_text="tokens mode: what one output token costs a tenant. Above the input weight because a "
        "backend decodes output one token per step but prefills the prompt in parallel (hosted price "
        "lists charge output 3-5x input).",
    )
    tenant_default_output_tokens = models.PositiveIntegerField(
        "tenant default output tokens",
        default=256,
        help_text="tokens mode: output charged at launch for a call without max_tokens / "
        "max_completion_tokens; the completion's usage corrects it.",
    )
    max_queued_per_tenant = models.PositiveIntegerField(
        "max queued per tenant",
        null=True,
        blank=True,
        help_text="Admission: one tenant's submits are refused (QueueFull naming it) while this many of "
        "its requests wait. Blank: only max queued.",
    )
    sort_order = models.IntegerField(default=0, help_text="Position in the DRR ring.")
    updated_at = models.DateTimeField(auto_now=True)

    # Set by admin forms whose formset checks the group rules with all submitted rows.
    skip_group_check = False

    class Meta:
        ordering = ("group_id", "sort_order", "pool_id")

    def __str__(self) -> str:
        return self.pool_id

    def clean(self) -> None:
        super().clean()
        errors = pool_value_errors(pool_values(self))
        base, cap = self.retry_backoff_base_s, self.retry_backoff_cap_s
        if base is not None and cap is not None and base > cap:
            errors["retry_backoff_cap_s"] = "The backoff cap must not be below its base."
        if errors:
            raise ValidationError(errors)
        if self.skip_group_check or self.group_id is None:
            return
        self.check_group_rules()

    def check_group_rules(self) -> None:
        """The group rules with this pool's unsaved values in place of its stored ones."""
        group = self.group
        siblings: list[dict[str, Any]] = [pool_values(p) for p in group.pools.exclude(pk=self.pk)]
        problems = group_problems(
            policy=group.policy,
            total_concurrency=group.total_concurrency,
            pools=[*siblings, pool_values(self)],
        )
        if problems:
            raise ValidationError(problems)


__all__ = ["Backend", "FabricGroup", "ModelAlias", "Pool"]
