# ruff: noqa: E501
"""Backends become rows: every endpoint URL of a group or pool turns into a Backend the rows point at."""

import re
from urllib.parse import urlsplit

import django.db.models.deletion
from django.db import migrations, models

import pools.validation


def _backend_id(url: str, taken: set[str]) -> str:
    parts = urlsplit(url)
    host = (parts.hostname or "backend").lower()
    base = re.sub(r"[^a-z0-9._-]+", "-", f"{host}-{parts.port}" if parts.port else host).strip("-._")
    base = (base or "backend")[:56]
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}-{n}", n + 1
    taken.add(candidate)
    return candidate


def urls_to_backends(apps, schema_editor):
    """One backend per (URL, API key variable) in use; metrics unknown, so no load gating."""
    Backend = apps.get_model("pools", "Backend")
    FabricGroup = apps.get_model("pools", "FabricGroup")
    Pool = apps.get_model("pools", "Pool")
    made: dict[tuple[str, str], object] = {}
    taken: set[str] = set(Backend.objects.values_list("backend_id", flat=True))

    def backend_for(url: str, key_env: str):
        if (url, key_env) not in made:
            made[(url, key_env)] = Backend.objects.create(
                backend_id=_backend_id(url, taken),
                name=url,
                base_url=url,
                api_key_env=key_env,
                kind="openai",
                load_gating=False,
            )
        return made[(url, key_env)]

    for group in FabricGroup.objects.all():
        if group.default_endpoint_url:
            group.backend = backend_for(group.default_endpoint_url, group.api_key_env)
            group.save(update_fields=["backend"])
        for pool in Pool.objects.filter(group=group).exclude(endpoint_url=""):
            pool.backend = backend_for(pool.endpoint_url, group.api_key_env)
            pool.save(update_fields=["backend"])


def backends_to_urls(apps, schema_editor):
    FabricGroup = apps.get_model("pools", "FabricGroup")
    Pool = apps.get_model("pools", "Pool")
    for group in FabricGroup.objects.exclude(backend=None).select_related("backend"):
        group.default_endpoint_url = group.backend.base_url
        group.api_key_env = group.backend.api_key_env
        group.save(update_fields=["default_endpoint_url", "api_key_env"])
    for pool in Pool.objects.exclude(backend=None).select_related("backend"):
        pool.endpoint_url = pool.backend.base_url
        pool.save(update_fields=["endpoint_url"])


class Migration(migrations.Migration):
    dependencies = [("pools", "0003_delivery")]

    operations = [
        migrations.CreateModel(
            name="Backend",
            fields=[
                (
                    "backend_id",
                    models.CharField(
                        help_text="Stable id used in Valkey keys (shared load, breaker, in-flight count).",
                        max_length=63,
                        primary_key=True,
                        serialize=False,
                        validators=[pools.validation.validate_lane_id],
                        verbose_name="backend id",
                    ),
                ),
                ("name", models.CharField(blank=True, max_length=200, verbose_name="display name")),
                (
                    "base_url",
                    models.CharField(
                        help_text="OpenAI-compatible base URL, e.g. http://127.0.0.1:8100/v1. No credentials in the URL.",
                        max_length=500,
                        validators=[pools.validation.validate_endpoint_url],
                        verbose_name="base URL",
                    ),
                ),
                (
                    "api_key_env",
                    models.CharField(
                        blank=True,
                        help_text="NAME of the environment variable holding the backend API key (e.g. OPENAI_API_KEY), never the key itself.",
                        max_length=100,
                        validators=[pools.validation.validate_env_name],
                        verbose_name="API key environment variable",
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("vllm", "vLLM (load metrics: vllm:*)"),
                            ("sglang", "SGLang (load metrics: sglang:*)"),
                            ("openai", "OpenAI-compatible, no load metrics"),
                        ],
                        default="vllm",
                        help_text="Which load metrics the server exports; 'OpenAI-compatible' gates on max in flight alone.",
                        max_length=8,
                    ),
                ),
                (
                    "max_in_flight",
                    models.PositiveIntegerField(
                        default=64,
                        help_text="Cap on calls in flight to this backend across every pool, group and dispatcher.",
                        verbose_name="max in flight",
                    ),
                ),
                (
                    "timeout_s",
                    models.FloatField(
                        default=120.0,
                        help_text="Upper bound of one call (the request deadline bounds it too).",
                        verbose_name="call timeout (s)",
                    ),
                ),
                ("connect_timeout_s", models.FloatField(default=5.0, verbose_name="connect timeout (s)")),
                (
                    "metrics_url",
                    models.CharField(
                        blank=True,
                        help_text="Prometheus metrics of the server; empty: the base URL's server at /metrics.",
                        max_length=500,
                        validators=[pools.validation.validate_endpoint_url],
                        verbose_name="metrics URL",
                    ),
                ),
                (
                    "load_gating",
                    models.BooleanField(
                        default=True,
                        help_text="Hold work in our queues while the backend is saturated (needs a kind with load metrics).",
                        verbose_name="load gating",
                    ),
                ),
                (
                    "max_waiting",
                    models.PositiveIntegerField(
                        default=5,
                        help_text="Saturated when this many requests wait in the backend's own queue.",
                        verbose_name="max waiting",
                    ),
                ),
                (
                    "max_kv_cache_usage",
                    models.FloatField(
                        default=0.8,
                        help_text="Saturated at this KV-cache usage (0 to 1).",
                        verbose_name="max KV-cache usage",
                    ),
                ),
                (
                    "metrics_max_age_s",
                    models.FloatField(
                        default=1.0,
                        help_text="Older metrics are stale: gating falls back to max in flight alone.",
                        verbose_name="metrics max age (s)",
                    ),
                ),
                (
                    "breaker_failures",
                    models.PositiveIntegerField(
                        default=5,
                        help_text="Retryable failures within 30 s that open the breaker.",
                        verbose_name="breaker: failures to open",
                    ),
                ),
                (
                    "breaker_open_s",
                    models.FloatField(
                        default=10.0,
                        help_text="How long calls are held before a probe.",
                        verbose_name="breaker: open for (s)",
                    ),
                ),
                (
                    "breaker_probes",
                    models.PositiveIntegerField(
                        default=1,
                        help_text="Successful probes (one at a time, fleet-wide) that close it.",
                        verbose_name="breaker: probes",
                    ),
                ),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={"ordering": ("backend_id",)},
        ),
        migrations.AddField(
            model_name="fabricgroup",
            name="backend",
            field=models.ForeignKey(
                blank=True,
                help_text="Backend of the pools that name none.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="groups",
                to="pools.backend",
                verbose_name="default backend",
            ),
        ),
        migrations.AddField(
            model_name="pool",
            name="backend",
            field=models.ForeignKey(
                blank=True,
                help_text="Optional; empty uses the group's default backend.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="pools",
                to="pools.backend",
            ),
        ),
        migrations.AddField(
            model_name="pool",
            name="max_queued",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Admission: submits are refused (QueueFull) while this many wait. Blank: unbounded.",
                null=True,
                verbose_name="max queued",
            ),
        ),
        migrations.AddField(
            model_name="pool",
            name="max_queue_wait_s",
            field=models.FloatField(
                blank=True,
                help_text="Admission: refuse when the estimated wait (queue length / recent drain rate) exceeds it.",
                null=True,
                verbose_name="max queue wait (s)",
            ),
        ),
        migrations.RunPython(urls_to_backends, backends_to_urls),
        migrations.RemoveField(model_name="fabricgroup", name="default_endpoint_url"),
        migrations.RemoveField(model_name="fabricgroup", name="api_key_env"),
        migrations.RemoveField(model_name="pool", name="endpoint_url"),
    ]
