"""A fabric group's configuration as published to Valkey for running dispatchers.

The Django ``pools`` app is the source of truth; on every change it publishes the group here
(one atomic script: config JSON, the pool registry producers check at submit, and a change
notification). Dispatchers read it at start, on the notification, and on a short poll as a
fallback, so an admin edit reaches every dispatcher within seconds without a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

import orjson

from runtime.errors import MalformedEnvelope
from runtime.immutable import immutable
from runtime.policy.admission import AdmissionLimits
from runtime.policy.retry import RetryPolicy
from runtime.policy.scheduler import GroupPolicy, PoolPolicy
from runtime.policy.tenants import MODES, OFF, TOKENS, TenantCost
from runtime.wire.backendconfig import BackendConfig

POLICIES = ("fifo", "drr")
LISTS = "lists"
DURABLE = "durable"
DELIVERIES = (LISTS, DURABLE)
COST_UNITS = "units"  # the seed's: cost_units, else images and pages
COST_TOKENS = "tokens"  # estimated tokens, weighted by the pool's token weights
COST_MODES = (COST_UNITS, COST_TOKENS)


@lru_cache(maxsize=256)
def _tenant_cost(mode: str, input_weight: float, output_weight: float) -> TenantCost:
    """One TenantCost per distinct setting: every fair-pool launch and completion asks for it."""
    return TenantCost(mode, input_weight, output_weight)


@immutable
class PoolConfig:
    """One pool as dispatchers and producers see it. ``endpoint_url`` is resolved from the pool's
    backend (or the group's) at publication, so tools reading the seed's field keep working."""

    pool_id: str
    quantum: int = 1
    max_concurrent: int = 8
    min_concurrent: int = 0
    max_burst_per_visit: int = 1
    display_name: str = ""
    endpoint_url: str = ""
    enabled: bool = True
    paused: bool = False
    max_attempts: int = 1
    retry_backoff_base_s: float = 0.5
    retry_backoff_cap_s: float = 30.0
    max_requeues: int = 3
    backend_id: str = ""  # empty: the group's backend
    max_queued: int | None = None
    max_queue_wait_s: float | None = None
    # Fairness between the pool's tenants (issue 22); the defaults decode configs published before it.
    tenant_fairness: str = OFF
    tenant_input_weight: float = 1.0
    tenant_output_weight: float = 4.0
    tenant_default_output_tokens: int = 256
    max_queued_per_tenant: int | None = None

    def token_weights(self) -> TenantCost:
        """The pool's token weights whatever its tenant fairness: what a request costs its pool's DRR
        credit in a group whose ``cost_mode`` is tokens (see :func:`runtime.policy.cost.token_cost`)."""
        return TenantCost(TOKENS, self.tenant_input_weight, self.tenant_output_weight)

    def tenant_cost(self) -> TenantCost | None:
        """What a request costs a tenant of this pool; None when the pool is first come, first served."""
        if self.tenant_fairness == OFF:
            return None
        return _tenant_cost(self.tenant_fairness, self.tenant_input_weight, self.tenant_output_weight)

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.retry_backoff_base_s, self.retry_backoff_cap_s)

    def admission_limits(self, backend: BackendConfig | None = None) -> AdmissionLimits:
        """The pool's limits, with what admission reads of its drain: paused, and ``backend``'s breaker."""
        return AdmissionLimits(
            max_queued=self.max_queued,
            max_queue_wait_s=self.max_queue_wait_s,
            paused=self.paused,
            breaker_backend_id=backend.backend_id if backend is not None else "",
            breaker_open_s=backend.breaker_open_s if backend is not None else 0.0,
        )

    def policy(self) -> PoolPolicy:
        return PoolPolicy(
            pool_id=self.pool_id,
            quantum=self.quantum,
            max_concurrent=self.max_concurrent,
            min_concurrent=self.min_concurrent,
            max_burst_per_visit=self.max_burst_per_visit,
            paused=self.paused,
        )


@immutable
class ModelAlias:
    """A model name clients may send instead of a pool header: ``alias`` routes to ``pool_id`` and
    reaches the backend as ``model`` (LiteLLM's ``model_list`` entry, per group)."""

    alias: str
    pool_id: str
    model: str


class PoolRoute(NamedTuple):
    """Where one pool's calls go: its backend row (None for a bare URL) and the URL itself."""

    backend: BackendConfig | None
    endpoint: str

    @property
    def backend_id(self) -> str:
        return self.backend.backend_id if self.backend is not None else ""


# Not slotted: the lookups below are cached per (immutable) instance in its __dict__, so that a
# scheduling round's many pool -> backend/URL questions are dict lookups, not scans (issue 13).
@dataclass(frozen=True)
class GroupConfig:
    """A group as published. ``default_endpoint_url`` and ``api_key_env`` are the group's backend's,
    kept for tools that read the seed's fields; ``backends`` holds every backend the group uses."""

    group_id: str
    policy: str = "drr"
    total_concurrency: int = 16
    default_endpoint_url: str = ""
    api_key_env: str = ""
    queueing_enabled: bool = True
    delivery: str = LISTS
    cost_mode: str = COST_UNITS  # what a request costs its pool's DRR credit
    name: str = ""
    pools: tuple[PoolConfig, ...] = field(default_factory=tuple)
    version: int = 0
    backend_id: str = ""
    backends: tuple[BackendConfig, ...] = field(default_factory=tuple)
    # Durable delivery: replicas that must hold a push (WAIT/WAITAOF) before the producer is answered.
    persist_replicas: int = 0
    aliases: tuple[ModelAlias, ...] = field(default_factory=tuple)  # model-based routing (issue 24)

    @cached_property
    def enabled_pools(self) -> tuple[PoolConfig, ...]:
        return tuple(p for p in self.pools if p.enabled)

    def scheduler_policy(self) -> GroupPolicy:
        return GroupPolicy(
            policy=self.policy,
            total_concurrency=self.total_concurrency,
            pools=tuple(p.policy() for p in self.enabled_pools),
        )

    def route(self, pool_id: str) -> PoolRoute:
        """The pool's backend and URL; a pool the group does not have goes to the group's backend."""
        route = self._routes.get(pool_id)
        return route if route is not None else self._resolve(None)

    def endpoint_for(self, pool_id: str) -> str:
        """The pool's URL: as published, else its backend's, else the group's default."""
        return self.route(pool_id).endpoint

    def backend_for(self, pool_id: str) -> BackendConfig | None:
        """The backend a pool's calls go to: its own, else the group's; None for a bare-URL config."""
        return self.route(pool_id).backend

    def backend(self, backend_id: str) -> BackendConfig | None:
        return self._backends_by_id.get(backend_id)

    def api_key_env_for(self, pool_id: str) -> str:
        """The variable holding the key for the pool's calls: its backend's (even when that backend
        needs none), else, for a bare-URL configuration, the group's."""
        backend = self.route(pool_id).backend
        return backend.api_key_env if backend is not None else self.api_key_env

    @property
    def durable(self) -> bool:
        return self.delivery == DURABLE

    def pool(self, pool_id: str) -> PoolConfig | None:
        return self._pools_by_id.get(pool_id)

    @cached_property
    def _pools_by_id(self) -> dict[str, PoolConfig]:
        pools: dict[str, PoolConfig] = {}
        for pool in self.pools:
            pools.setdefault(pool.pool_id, pool)  # the first of a repeated id wins, as a scan found it
        return pools

    @cached_property
    def _backends_by_id(self) -> dict[str, BackendConfig]:
        backends: dict[str, BackendConfig] = {}
        for backend in self.backends:
            backends.setdefault(backend.backend_id, backend)
        return backends

    @cached_property
    def _routes(self) -> dict[str, PoolRoute]:
        return {pool_id: self._resolve(pool) for pool_id, pool in self._pools_by_id.items()}

    def _resolve(self, pool: PoolConfig | None) -> PoolRoute:
        wanted = (pool.backend_id if pool else "") or self.backend_id
        backend = self.backend(wanted) if wanted else None
        if pool is not None and pool.endpoint_url:
            return PoolRoute(backend, pool.endpoint_url)
        return PoolRoute(backend, backend.base_url if backend is not None else self.default_endpoint_url)

    def encode(self) -> bytes:
        data = asdict(self)
        if (
            not self.aliases
        ):  # a group without aliases reads as before them (older dispatchers refuse the key)
            del data["aliases"]
        return orjson.dumps(data)

    @classmethod
    def decode(cls, raw: bytes | str) -> GroupConfig:
        try:
            data: Mapping[str, Any] = orjson.loads(raw)
            pools = tuple(PoolConfig(**p) for p in data.get("pools", ()))
            backends = tuple(BackendConfig(**b) for b in data.get("backends", ()))
            aliases = tuple(ModelAlias(**a) for a in data.get("aliases", ()))
            config = cls(**{**data, "pools": pools, "backends": backends, "aliases": aliases})
        except (orjson.JSONDecodeError, TypeError, AttributeError) as exc:
            raise MalformedEnvelope(f"published group configuration is unreadable: {exc}") from exc
        if config.policy not in POLICIES:
            raise MalformedEnvelope(f"group {config.group_id}: unknown policy {config.policy!r}")
        if config.delivery not in DELIVERIES:
            raise MalformedEnvelope(f"group {config.group_id}: unknown delivery {config.delivery!r}")
        if config.cost_mode not in COST_MODES:
            raise MalformedEnvelope(f"group {config.group_id}: unknown cost mode {config.cost_mode!r}")
        for alias in config.aliases:
            if config.pool(alias.pool_id) is None:
                raise MalformedEnvelope(
                    f"group {config.group_id}: model alias {alias.alias!r} names pool {alias.pool_id!r}, "
                    "which the group does not have"
                )
        for pool in config.pools:
            if pool.tenant_fairness not in MODES:
                raise MalformedEnvelope(
                    f"group {config.group_id}: pool {pool.pool_id}: unknown tenant_fairness "
                    f"{pool.tenant_fairness!r} (one of {', '.join(MODES)})"
                )
        try:
            for pool in config.pools:
                pool.retry_policy()
                pool.tenant_cost()
        except ValueError as exc:
            raise MalformedEnvelope(f"group {config.group_id}: {exc}") from exc
        return config
