"""A proposed configuration: the one in force with ``name.field=value`` assignments applied.

The command line (``--set backfill.weight=2``) and the admin's What-if panel (the form's fields, sent
the same way) both describe a change as assignments, so both reach the replay through one parser:

    <pool_id>.<field>=<value>              weight (= quantum), max_concurrent, min_concurrent,
                                           max_burst_per_visit (= burst), paused, enabled,
                                           max_queued, max_queue_wait_s (empty or "none": unbounded),
                                           backend (a backend id of the group; empty: the group's),
                                           tenant_fairness (off | requests | tokens),
                                           max_queued_per_tenant (empty or "none": unbounded)
    group.<field>=<value>                  total_concurrency, policy (drr | fifo), backend
    backend.<backend_id>.max_in_flight=N   a backend's fleet-wide cap

Pure; a bad assignment raises :class:`BadChange` naming it, and the result is checked with the
scheduler's own :func:`~runtime.policy.scheduler.validate_policy`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from runtime.policy.scheduler import POLICIES, validate_policy
from runtime.policy.tenants import MODES
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig

__all__ = ["BadChange", "apply_changes", "parse_assignment"]


class BadChange(ValueError):
    """An assignment the replay cannot apply; the message says which and why."""


def _int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return parse


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda text: None if text.strip().lower() in ("", "none") else parse(text)


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


# field name as typed -> (PoolConfig attribute, parser)
POOL_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "weight": ("quantum", _int(1)),
    "quantum": ("quantum", _int(1)),
    "max_concurrent": ("max_concurrent", _int(1)),
    "min_concurrent": ("min_concurrent", _int(0)),
    "max_burst_per_visit": ("max_burst_per_visit", _int(1)),
    "burst": ("max_burst_per_visit", _int(1)),
    "paused": ("paused", _bool),
    "enabled": ("enabled", _bool),
    "max_queued": ("max_queued", _optional(_int(1))),
    "max_queue_wait_s": ("max_queue_wait_s", _optional(_positive_float)),
    "backend": ("backend_id", str.strip),
    "tenant_fairness": ("tenant_fairness", _choice(MODES)),
    "max_queued_per_tenant": ("max_queued_per_tenant", _optional(_int(1))),
}


def parse_assignment(text: str) -> tuple[str, str, str]:
    """``"a.b=c"`` -> ``("a", "b", "c")``; ``backend.<id>.field=v`` keeps ``backend.<id>`` as the name."""
    name, sep, value = text.partition("=")
    target, dot, fieldname = name.strip().rpartition(".")
    if not sep or not dot or not target or not fieldname:
        raise BadChange(f"{text!r}: expected NAME.FIELD=VALUE, e.g. backfill.weight=2")
    return target, fieldname, value.strip()


def apply_changes(config: GroupConfig, assignments: Iterable[str]) -> GroupConfig:
    """``config`` with every assignment applied, in order; raises :class:`BadChange`."""
    group: dict[str, Any] = {}
    pools = {p.pool_id: p for p in config.pools}
    backends = {b.backend_id: b for b in config.backends}
    for text in assignments:
        target, fieldname, value = parse_assignment(text)
        if target == "group":
            group.update(_group_change(text, fieldname, value, backends))
        elif target.startswith("backend."):
            backend_id = target.removeprefix("backend.")
            backends[backend_id] = _backend_change(text, backends.get(backend_id), fieldname, value)
        elif target in pools:
            pools[target] = _pool_change(text, pools[target], fieldname, value, backends)
        else:
            known = ", ".join(sorted(pools)) or "none"
            raise BadChange(f"{text!r}: group {config.group_id!r} has no pool {target!r} (pools: {known})")
    changed = dataclasses.replace(
        config,
        **group,
        pools=tuple(pools[p.pool_id] for p in config.pools),
        backends=tuple(backends.values()),
    )
    problems = validate_policy(changed.scheduler_policy())
    if problems:
        raise BadChange("; ".join(problems))
    return changed


def _pool_change(
    text: str, pool: PoolConfig, fieldname: str, value: str, backends: dict[str, BackendConfig]
) -> PoolConfig:
    known = POOL_FIELDS.get(fieldname)
    if known is None:
        raise BadChange(f"{text!r}: unknown pool field {fieldname!r}; known: {', '.join(POOL_FIELDS)}")
    attr, parse = known
    try:
        parsed = parse(value)
    except ValueError as exc:
        raise BadChange(f"{text!r}: {fieldname} {exc}") from exc
    if attr == "backend_id" and parsed and parsed not in backends:
        raise BadChange(f"{text!r}: the group uses no backend {parsed!r} (known: {', '.join(backends)})")
    return dataclasses.replace(pool, **{attr: parsed})


def _group_change(
    text: str, fieldname: str, value: str, backends: dict[str, BackendConfig]
) -> dict[str, Any]:
    if fieldname == "total_concurrency":
        try:
            return {"total_concurrency": _int(1)(value)}
        except ValueError as exc:
            raise BadChange(f"{text!r}: total_concurrency {exc}") from exc
    if fieldname == "policy":
        if value not in POLICIES:
            raise BadChange(f"{text!r}: policy must be one of {', '.join(POLICIES)}")
        return {"policy": value}
    if fieldname == "backend":
        if value and value not in backends:
            raise BadChange(f"{text!r}: the group uses no backend {value!r}")
        return {"backend_id": value}
    raise BadChange(f"{text!r}: unknown group field {fieldname!r}; known: total_concurrency, policy, backend")


def _backend_change(text: str, backend: BackendConfig | None, fieldname: str, value: str) -> BackendConfig:
    if backend is None:
        raise BadChange(f"{text!r}: the group uses no such backend")
    if fieldname != "max_in_flight":
        raise BadChange(f"{text!r}: unknown backend field {fieldname!r}; known: max_in_flight")
    try:
        return dataclasses.replace(backend, max_in_flight=_int(1)(value))
    except ValueError as exc:
        raise BadChange(f"{text!r}: max_in_flight {exc}") from exc
