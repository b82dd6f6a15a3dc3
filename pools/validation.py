"""Validation rules of fabric groups and pools, shared by the models, the admin forms and the checks.

Field rules (ids, URLs, env var names, per-pool numbers) live here with the messages operators see.
Group rules (protected slots against the group total, duplicates) are the scheduler's own
:func:`runtime.policy.scheduler.validate_policy`, so the admin and the dispatcher agree on what is valid.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

from runtime.backends.redact import url_has_credentials
from runtime.policy.scheduler import GroupPolicy, PoolPolicy, validate_policy
from runtime.policy.tenants import MODES, TOKENS
from runtime.policy.tokens import MAX_TOKENS

ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
ID_RE = re.compile(ID_PATTERN)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Single-label hosts are fine (docker / k8s service names like ``http://vllm:8000/v1``).
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$", re.IGNORECASE)


def _is_http_url(value: str) -> bool:
    if any(c.isspace() for c in value):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        return False
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        return False
    if "[" in parts.netloc:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return False
        return True
    return bool(_HOST_RE.fullmatch(host))


def validate_lane_id(value: str) -> None:
    """Pool and group ids end up in Valkey key names: lowercase slug, 1-63 characters."""
    if not ID_RE.fullmatch(value or ""):
        raise ValidationError(
            "%(value)r is not a valid id: use 1-63 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit.",
            code="invalid_id",
            params={"value": value},
        )


def validate_endpoint_url(value: str) -> None:
    """An OpenAI-compatible base URL: http or https, and no secret inside it."""
    if not value:
        return
    if url_has_credentials(value):
        # Never echo the value: it holds a secret.
        raise ValidationError(
            "This URL embeds credentials (user:password@ or a secret query parameter such as api_key). "
            "Remove them and put the key in the environment variable named by the group's API key env.",
            code="url_credentials",
        )
    if not _is_http_url(value):
        raise ValidationError(
            "Enter a valid http:// or https:// URL, e.g. http://127.0.0.1:8100/v1.", code="invalid_url"
        )


def validate_env_name(value: str) -> None:
    """The NAME of an environment variable (e.g. OPENAI_API_KEY), never the key itself."""
    if value and not ENV_NAME_RE.fullmatch(value):
        raise ValidationError(
            "Enter the name of an environment variable (letters, digits and '_', e.g. OPENAI_API_KEY), "
            "not the key itself.",
            code="invalid_env_name",
        )


def pool_value_errors(values: Mapping[str, Any]) -> dict[str, str]:
    """Per-pool number rules, keyed by field name; values that are missing are skipped."""
    errors: dict[str, str] = {}
    quantum, burst = values.get("quantum"), values.get("max_burst_per_visit")
    low, high = values.get("min_concurrent"), values.get("max_concurrent")
    if quantum is not None and quantum < 1:
        errors["quantum"] = "Weight must be at least 1 (it is relative dispatch credit per round)."
    if burst is not None and burst < 1:
        errors["max_burst_per_visit"] = "Max burst per visit must be at least 1."
    if high is not None and high < 1:
        errors["max_concurrent"] = "Max concurrent must be at least 1: a pool with a cap of 0 never runs."
    max_queued, max_wait = values.get("max_queued"), values.get("max_queue_wait_s")
    if max_queued is not None and max_queued < 1:
        errors["max_queued"] = "Max queued must be at least 1, or blank for an unbounded queue."
    if max_wait is not None and not max_wait > 0:
        errors["max_queue_wait_s"] = "Max queue wait must be more than 0 seconds, or blank for no limit."
    errors.update(tenant_value_errors(values))
    if low is not None and low < 0:
        errors["min_concurrent"] = "Min concurrent must not be negative."
    elif low is not None and high is not None and high >= 1 and low > high:
        errors["min_concurrent"] = (
            f"Min concurrent ({low}) must not exceed max concurrent ({high}): "
            "protected slots cannot be more than the pool's hard cap."
        )
    return errors


def tenant_value_errors(values: Mapping[str, Any]) -> dict[str, str]:
    """A pool's tenant-fairness rules (issue 22), keyed by field name; missing values are skipped."""
    errors: dict[str, str] = {}
    mode = values.get("tenant_fairness")
    if mode is not None and mode not in MODES:
        errors["tenant_fairness"] = f"Tenant fairness must be one of {', '.join(MODES)}, not {mode!r}."
    weights = {name: values.get(name) for name in ("tenant_input_weight", "tenant_output_weight")}
    for name, weight in weights.items():
        if weight is not None and not 0 <= weight < math.inf:
            errors[name] = "A token weight must be a finite number, 0 or more."
    if mode == TOKENS and not errors and all(w is not None and w == 0 for w in weights.values()):
        errors["tenant_output_weight"] = (
            "With tenant fairness in tokens, at least one token weight must be above 0: "
            "otherwise every request costs nothing and no tenant is ever ahead."
        )
    output = values.get("tenant_default_output_tokens")
    if output is not None and not 0 <= output <= MAX_TOKENS:
        errors["tenant_default_output_tokens"] = f"Default output tokens must be between 0 and {MAX_TOKENS}."
    per_tenant, max_queued = values.get("max_queued_per_tenant"), values.get("max_queued")
    if per_tenant is not None and per_tenant < 1:
        errors["max_queued_per_tenant"] = "Max queued per tenant must be at least 1, or blank for no cap."
    elif per_tenant is not None and max_queued is not None and max_queued >= 1 and per_tenant > max_queued:
        errors["max_queued_per_tenant"] = (
            f"Max queued per tenant ({per_tenant}) must not exceed max queued ({max_queued}): "
            "one tenant's cap above the pool's own never applies."
        )
    return errors


def backend_value_errors(values: Mapping[str, Any]) -> dict[str, str]:
    """A backend row's number rules, keyed by field name; values that are missing are skipped."""
    errors: dict[str, str] = {}

    def below(name: str, floor: float, message: str, *, inclusive: bool = True) -> None:
        value = values.get(name)
        if value is not None and (value < floor if inclusive else value <= floor):
            errors[name] = message

    below(
        "max_in_flight", 1, "Max in flight must be at least 1: a backend with a cap of 0 never gets a call."
    )
    below("timeout_s", 0, "The call timeout must be more than 0 seconds.", inclusive=False)
    below("connect_timeout_s", 0, "The connect timeout must be more than 0 seconds.", inclusive=False)
    below("metrics_max_age_s", 0, "Metrics max age must be more than 0 seconds.", inclusive=False)
    below("metrics_timeout_s", 0, "The metrics timeout must be more than 0 seconds.", inclusive=False)
    below("metrics_max_bytes", 1024, "The metrics max size must be at least 1024 bytes.")
    below("breaker_failures", 1, "The breaker needs at least 1 failure to open.")
    below("breaker_open_s", 0, "The breaker's open time must be more than 0 seconds.", inclusive=False)
    below("breaker_probes", 1, "The breaker needs at least 1 probe to close again.")
    below("max_waiting", 0, "Max waiting must not be negative.")
    usage = values.get("max_kv_cache_usage")
    if usage is not None and not 0 < usage <= 1:
        errors["max_kv_cache_usage"] = (
            f"Max KV-cache usage is a fraction of the cache: more than 0 and at most 1 (got {usage:g})."
        )
    if values.get("load_gating") and values.get("kind") == "openai":
        errors["load_gating"] = (
            "Load gating needs load metrics, and an 'OpenAI-compatible' backend exports none: "
            "choose the server's engine (vLLM, SGLang, llama.cpp, TGI), or turn load gating off "
            "(max in flight still holds)."
        )
    return errors


def pool_policy(values: Mapping[str, Any]) -> PoolPolicy:
    """The scheduler's view of a pool, from a model instance's or a form's values.

    ``paused`` is deliberately False: a paused pool comes back by a resume that does not
    re-validate, so its protected slots must already fit the group.
    """
    return PoolPolicy(
        pool_id=str(values.get("pool_id") or ""),
        quantum=int(values.get("quantum") or 0),
        max_concurrent=int(values.get("max_concurrent") or 0),
        min_concurrent=int(values.get("min_concurrent") or 0),
        max_burst_per_visit=int(values.get("max_burst_per_visit") or 0),
        paused=False,
    )


def group_problems(*, policy: str, total_concurrency: int, pools: Iterable[Mapping[str, Any]]) -> list[str]:
    """The scheduler's verdict on a group whose enabled pools have these values."""
    enabled = tuple(pool_policy(p) for p in pools if p.get("enabled", True))
    return validate_policy(GroupPolicy(policy=policy, total_concurrency=total_concurrency, pools=enabled))


def pool_values(pool: Any) -> dict[str, Any]:
    """The fields :func:`group_problems` reads, from a Pool (or a published PoolConfig)."""
    fields = ("pool_id", "quantum", "max_concurrent", "min_concurrent", "max_burst_per_visit", "enabled",
              "max_queued", "max_queue_wait_s", "tenant_fairness", "tenant_input_weight",
              "tenant_output_weight", "tenant_default_output_tokens", "max_queued_per_tenant")  # fmt: skip
    return {name: getattr(pool, name) for name in fields}
