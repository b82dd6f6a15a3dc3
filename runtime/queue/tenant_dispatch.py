"""Dispatcher side of a fair pool (``tenant_fairness`` on, issue 22): observe, claim with a charge,
correct on completion.

``lua/tenant_observe.lua`` reads the pool's W lowest backlogged tenants (their counters, weights,
queued counts and first heads) and the next one as the plan's horizon, in O(log n + W).
``lua/tenant_claim.lua`` is CLAIM (``lua/_claim.lua``) on the tenant's own list, charging the tenant's
counter by the dispatcher's estimate / weight as the head leaves; the call's FINISH adds
(actual - estimate) / weight when the backend reported its usage (``lua/_tenant_correct.lua``, in the
same script, so a stale dispatcher's correction is refused with its reply). Charges and corrections
are increments, so two dispatchers' never drift; the SHA-1 check makes a raced head a ``moved``.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

from runtime.immutable import immutable
from runtime.queue import scripts
from runtime.queue.keys import UNTAGGED, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace

__all__ = [
    "TENANT_VIEW_WIDTH",
    "FairPick",
    "FairView",
    "TenantHeads",
    "bury_fair_args",
    "claim_keys",
    "dead_letter_take_fair_args",
    "finish_fair_args",
    "forget_call",
    "leftover_backlog",
    "observe_call",
    "parse_view",
    "promote_call",
    "reap_fair_args",
    "token_request",
    "view_keys",
    "view_width",
]

TENANT_VIEW_WIDTH = 16  # tenants viewed per observation (W); one more is read as the horizon


def view_width(depth: int) -> int:
    """Tenants viewed when a round launches at most ``depth``: no more than it could pick from (a plan
    that runs out of viewed tenants stops at the horizon, never guesses), at most W."""
    return max(2, min(TENANT_VIEW_WIDTH, depth))


@immutable
class TenantHeads:
    """One viewed tenant: its counter and weight, how many it has queued, its first heads."""

    tenant: str
    counter: float
    weight: float
    queued: int
    heads: tuple[bytes, ...]


@immutable
class FairView:
    """What one observation saw of a fair pool's tenants."""

    tenants: tuple[TenantHeads, ...]
    horizon: tuple[float, str] | None  # (counter, tenant) of the first tenant left out of the view


@immutable
class FairPick:
    """A planned head of a fair pool: whose it is, what its launch charges, what it was estimated at."""

    tenant: str
    charge: float  # cost / weight, added to the tenant's counter by the claim
    prompt_tokens: int = 0
    output_tokens: int = 0
    weight: float = 1.0
    from_token: bool = False  # planned from a wake token alone: claimed only while its tenant is the pick


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@functools.lru_cache(maxsize=1024)
def view_keys(keys: KeySpace, pool_id: str) -> tuple[tuple[str, ...], str]:
    """What a fair pool's view reads (``lua/_tenant_view.lua``): its backlogged tenants, weights, queued
    count, pool lease zset, the seed's list and counters; and its tenant lists' key prefix."""
    return (
        (
            keys.tenants(pool_id), keys.tenant_weights(pool_id), keys.pool_queued(pool_id),
            keys.pool_inflight(pool_id), keys.requests(pool_id), keys.tenant_counters(pool_id),
        ),
        keys.tenant_requests(pool_id, ""),
    )  # fmt: skip


def observe_call(
    keys: KeySpace,
    pool_id: str,
    group_inflight: str,
    depth: int,
    pool_max: int,
    group_limit: int,
    display: bool,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/tenant_observe.lua``."""
    (zset, weights, queued, inflight, seed, counters), prefix = view_keys(keys, pool_id)
    return (
        [zset, weights, queued, inflight, group_inflight, seed, counters],
        [depth, pool_max, group_limit, int(display), view_width(depth), prefix],
    )


def _weight(raw: Any) -> float:
    try:
        weight = float(_text(raw))
    except ValueError:
        return 1.0
    return weight if 0 < weight < float("inf") else 1.0


def token_request(token: bytes) -> tuple[float, bytes] | None:
    """The tenant's weight and the request of a fair pool's wake token (``lua/_tenant_queue.lua``:
    ``<weight> <envelope>``); None for any other token (a plain pool's, a slot's ``1``)."""
    weight, space, raw = token.partition(b" ")
    try:
        parsed = float(weight)
    except ValueError:
        return None
    return (parsed, raw) if space and raw and 0 < parsed < float("inf") else None


def parse_view(view: Sequence[Any], horizon: Sequence[Any]) -> FairView:
    """The script's view and horizon, typed (a weight that is not a positive number counts as 1)."""
    tenants = tuple(
        TenantHeads(_text(t), float(_text(c)), _weight(w), int(n), tuple(heads)) for t, c, w, n, heads in view
    )
    return FairView(tenants, (float(_text(horizon[1])), _text(horizon[0])) if horizon else None)


@functools.lru_cache(maxsize=1024)
def _pool_keys(keys: KeySpace, pool_id: str) -> tuple[str, str, str, str]:
    """A fair pool's tenant lists' prefix, backlogged tenants, counters and queued count: every claim
    and finish of the pool names them."""
    return (
        keys.tenant_requests(pool_id, ""), keys.tenants(pool_id), keys.tenant_counters(pool_id),
        keys.pool_queued(pool_id),
    )  # fmt: skip


def claim_keys(keys: KeySpace, pool_id: str, pick: FairPick) -> tuple[str, list[str]]:
    """The tenant's list (CLAIM's first key) and the keys TENANT_CLAIM appends to CLAIM's."""
    lists, zset, counters, count = _pool_keys(keys, pool_id)
    return keys.requests(pool_id) if pick.tenant == UNTAGGED else lists + pick.tenant, [zset, counters, count]


def bury_fair_args(
    keys: KeySpace, pool_id: str, pick: FairPick, bury_keys: list[str], bury_args: list[Any]
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/tenant_bury.lua`` from BURY's: the head is taken from its tenant's list."""
    return (
        [keys.tenant_requests(pool_id, pick.tenant), *bury_keys[1:], keys.tenants(pool_id),
         keys.tenant_counters(pool_id), keys.pool_queued(pool_id)],
        [*bury_args, pick.tenant],
    )  # fmt: skip


def dead_letter_take_fair_args(
    keys: KeySpace, pool_id: str, stored: bytes, queued: bytes, tenant: str | None
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/tenant_dead_letter_take.lua``: a replay onto ``tenant``'s list (None:
    untagged, the seed's list as tenant ``*``)."""
    return (
        [keys.dead_letters(pool_id), keys.requests(pool_id), keys.tenants(pool_id),
         keys.tenant_counters(pool_id), keys.pool_queued(pool_id)],
        [stored, queued, keys.tenant_requests(pool_id, ""), UNTAGGED if tenant is None else tenant],
    )  # fmt: skip


def leftover_backlog(pool_ids: Sequence[str], counts: Sequence[Any]) -> dict[str, int]:
    """The pools read first come, first served whose queued count (``GET`` of each) says their tenants'
    lists still hold work: fairness switched off while they did."""
    return {pool_id: int(n) for pool_id, n in zip(pool_ids, counts, strict=True) if n and int(n) > 0}


def promote_call(keys: KeySpace, pool_id: str) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/tenant_promote.lua``."""
    return (
        [
            keys.delayed(pool_id), keys.requests(pool_id), keys.wake_list(pool_id), keys.tenants(pool_id),
            keys.tenant_counters(pool_id), keys.pool_queued(pool_id),
        ],
        [scripts.PROMOTE_BATCH, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, keys.tenant_requests(pool_id, "")],
    )  # fmt: skip


def reap_fair_args(keys: KeySpace, fair_pools: Collection[str]) -> list[str]:
    """What REAP needs to requeue a fair pool's durable request onto its tenant's list (nothing when
    the group has no fair pool: the seed's reap)."""
    if not fair_pools:
        return []
    tenant_lists = keys.tenant_requests("\x00", "").split("\x00")[0]  # the prefix up to the pool id
    return [
        tenant_lists,
        keys.tenants(""),
        keys.tenant_counters(""),
        keys.pool_queued(""),
        *sorted(fair_pools),
    ]


# Counters hash fields an idle cleanup looks at per pool and reap (4 a second: 256 fields a second, a
# pool of 10,000 idle tenants swept in 40 s). 256 per reap was ~5 % of Valkey's work per completion
# at a few hundred completions a second, for a memory bound nobody needs that fast.
FORGET_SCAN = 64


def forget_call(keys: KeySpace, pool_id: str) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/tenant_forget.lua``."""
    return (
        [keys.tenant_counters(pool_id), keys.tenants(pool_id), keys.tenant_weights(pool_id),
         keys.tenant_scan(pool_id)],
        [FORGET_SCAN],
    )  # fmt: skip


def finish_fair_args(
    keys: KeySpace, pool_id: str, pick: FairPick | None, correction: float = 0.0, served: float = 0.0
) -> list[str]:
    """FINISH's extra arguments in a fair pool: where a requeue goes and, for a charged ``pick``, the
    ``correction`` of its charge (before the tenant's weight) and the cost it was ``served``."""
    extra = list(_pool_keys(keys, pool_id))
    if pick is not None and (correction or served):
        extra += [pick.tenant, repr(correction / pick.weight), repr(served), keys.tenant_served(pool_id)]
    return extra
