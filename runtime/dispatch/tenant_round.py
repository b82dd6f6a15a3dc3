"""A fair pool's part of the scheduling round (``tenant_fairness`` on, issue 22).

The observation reads a fair pool by tenant (:mod:`runtime.queue.tenant_dispatch`): its W lowest
backlogged tenants with their first heads. Here those become the pool's heads in the order the
tenants' virtual counters give (:func:`runtime.policy.tenants.plan_picks` over a
:class:`~runtime.policy.tenants.TenantLedger` of the view), each remembered with its tenant and
charge so that the claim takes it from the tenant's list and charges the tenant. ``decide()`` then
sees the pool as any other: its share between pools is unchanged, only the order inside it is the
tenants'. On completion the backend's ``usage`` corrects the launch estimate.
"""

from __future__ import annotations

from typing import Any

from runtime.dispatch.peek import PeekCache
from runtime.policy.tenants import OFF, TenantCost, TenantLedger, plan_picks
from runtime.policy.tokens import TokenCount, usage_tokens
from runtime.queue.dispatching import Observation, QueueOps, QueueView
from runtime.queue.keys import UNTAGGED
from runtime.queue.tenant_dispatch import FairPick, FairView, TenantHeads, token_request
from runtime.wire.groupconfig import GroupConfig, PoolConfig

__all__ = ["correct", "fair_pools", "plan_fair", "token_pick"]


def fair_pools(config: GroupConfig | None, queue: QueueOps | None = None) -> frozenset[str]:
    """The group's enabled pools whose tenants share them fairly, and those switched off while their
    tenants' lists still held work (as ``queue`` last saw them): read by tenant until drained, else
    that work would sit in lists nobody reads."""
    if config is None:
        return frozenset()
    fair = {p.pool_id for p in config.enabled_pools if p.tenant_fairness != OFF}
    if queue is not None and queue.fair_backlog:
        enabled = {p.pool_id for p in config.enabled_pools}
        fair.update(p for p, backlog in queue.fair_backlog.items() if backlog > 0 and p in enabled)
    return frozenset(fair)


def plan_pool(peek: PeekCache, pool: PoolConfig, view: QueueView, fair: FairView, launches: int) -> tuple[
    QueueView, dict[bytes, FairPick]
]:  # fmt: skip
    """The pool's view with its heads in the tenants' order, and each head's pick.

    Only a request's first attempt is charged at launch: a retry, or a durable request put back by an
    expired lease or a shutdown, was charged at its first launch, and the FINISH of the attempt that
    reports usage corrects that one charge. A dead letter replayed is a first attempt again.
    """
    cost = pool.tenant_cost() or TenantCost()
    if not view.heads_read:
        first = fair.tenants[0].heads[:1] if fair.tenants else ()
        return QueueView(view.backlog, (), view.in_flight, False, first[0] if first else None), {}
    default = pool.tenant_default_output_tokens
    counters: dict[str, float] = {}
    weights: dict[str, float] = {}
    queued: dict[str, int] = {}
    costs: dict[str, list[float]] = {}
    estimates: dict[str, list[TokenCount]] = {}
    by_tenant: dict[str, TenantHeads] = {}
    for seen in fair.tenants:
        tenant = seen.tenant
        counters[tenant], weights[tenant], queued[tenant], by_tenant[tenant] = (
            seen.counter, seen.weight, seen.queued, seen,
        )  # fmt: skip
        counted = [_launch_charge(peek, raw, cost, default) for raw in seen.heads]
        estimates[tenant] = [estimate for estimate, _ in counted]
        costs[tenant] = [charge for _, charge in counted]
    ledger = TenantLedger(counters, list(counters), weights=weights)
    heads: list[bytes] = []
    picks: dict[bytes, FairPick] = {}
    taken: dict[str, int] = {}
    for tenant, charged in plan_picks(ledger, costs, queued, launches, horizon=fair.horizon):
        index = taken.get(tenant, 0)
        taken[tenant] = index + 1
        seen = by_tenant[tenant]
        raw, estimate = seen.heads[index], estimates[tenant][index]
        heads.append(raw)
        picks[raw] = FairPick(tenant, charged / seen.weight, estimate.prompt, estimate.output, seen.weight)
    return QueueView(view.backlog, tuple(heads), view.in_flight, True), picks


def token_pick(peek: PeekCache, pool: PoolConfig, token: bytes) -> tuple[bytes, FairPick] | None:
    """A fair pool's wake token as a planned head: its request, and the pick charging its tenant as a
    view would (:func:`plan_pool`); None when the token holds no usable request (a slot's ``1``, a
    plain pool's token, a malformed envelope). The claim launches it only while its tenant is the
    pool's pick (``lua/tenant_claim.lua``)."""
    request = token_request(token)
    if request is None:
        return None
    weight, raw = request
    envelope = peek.get(raw).envelope
    if envelope is None:
        return None
    cost = pool.tenant_cost() or TenantCost()
    estimate, charge = _launch_charge(peek, raw, cost, pool.tenant_default_output_tokens)
    tenant = UNTAGGED if envelope.tenant is None else envelope.tenant
    return raw, FairPick(tenant, charge / weight, estimate.prompt, estimate.output, weight, from_token=True)


def _launch_charge(peek: PeekCache, raw: bytes, cost: TenantCost, default: int) -> tuple[TokenCount, float]:
    """A head's token estimate and what its launch charges its tenant before the weight (see
    :func:`plan_pool`: 0 for a later attempt)."""
    estimate, first = peek.estimate(raw, default)
    return estimate, cost.of(*estimate) if first else 0.0


def plan_fair(
    queue: QueueOps, peek: PeekCache, config: GroupConfig, seen: Observation, launches: int
) -> None:
    """Replaces each fair pool's head-less view in ``seen`` by its planned heads; records the picks."""
    queue.fair_picks = {}
    for pool_id, fair in seen.fair.items():
        pool = config.pool(pool_id)
        if pool is None:
            continue
        seen.views[pool_id], queue.fair_picks[pool_id] = plan_pool(
            peek, pool, seen.views[pool_id], fair, launches
        )


def correct(queue: QueueOps, member: str, completion: Any, pool: PoolConfig | None) -> None:
    """Stages the correction of a finished fair-pool call's charge by its reported usage for the call's
    FINISH (none reported: the estimate stands)."""
    pick = queue.charged(member)
    cost = pool.tenant_cost() if pool is not None else None
    if pick is None or cost is None:
        return
    if completion is None:  # failed: the estimate stands, and nothing was served
        queue.stage_correction(member, 0.0, 0.0)
        return
    estimate = (pick.prompt_tokens, pick.output_tokens)
    usage = usage_tokens(completion.body)
    # A later attempt is charged nothing at launch: it corrects the first attempt's charge all the same.
    queue.stage_correction(member, cost.correction(estimate, usage), cost.of(*(usage or estimate)))
