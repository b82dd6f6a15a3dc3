"""Launch claims whose answers the dispatcher lost, and what gives each back (``lua/give_back.lua``).

A claim pipeline cut off unanswered (the health check gave a frozen Valkey up) may still run: its
bytes were in Valkey's socket buffer. Then a request that never started is a lease of this dispatcher
that nobody renews, and REAP would count it lost in flight. The dispatcher remembers such claims and,
once Valkey answers again, gives each one that ran back to the head of its list.
"""

from __future__ import annotations

from runtime.immutable import immutable
from runtime.queue.dispatch_requests import ClaimRequest, ScriptArgs
from runtime.queue.keys import KeySpace
from runtime.queue.tenant_dispatch import FairPick, claim_keys


@immutable
class UnansweredClaim:
    request: ClaimRequest  # a launch
    pick: FairPick | None  # a fair pool's head: its tenant and charge (None: the pool's own list)


def give_back_args(keys: KeySpace, group_id: str, claim: UnansweredClaim) -> ScriptArgs:
    """KEYS and ARGV of ``lua/give_back.lua`` (which declares them) for one unanswered claim."""
    req = claim.request
    script_keys = [
        keys.requests(req.pool_id),
        keys.group_inflight(group_id),
        keys.pool_inflight(req.pool_id),
        keys.lease_records(group_id),
        keys.lease_tokens(group_id),
        keys.durable_leases(group_id),
        keys.backend_inflight(req.backend_id),
    ]
    args: list[object] = [req.lease_member, req.raw, req.lease_record]
    if claim.pick is not None:
        script_keys[0], tenant_keys = claim_keys(keys, req.pool_id, claim.pick)
        script_keys += tenant_keys
        args += [claim.pick.tenant, repr(claim.pick.charge)]
    return script_keys, args
