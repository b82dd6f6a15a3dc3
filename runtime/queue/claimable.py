"""What a push needs to claim its request against a dispatcher's standing claim ticket
(:mod:`runtime.dispatch.tickets`), for ``lua/push.lua`` and ``lua/admit_push.lua`` alike."""

from __future__ import annotations

from runtime.immutable import immutable
from runtime.queue.keys import KeySpace

__all__ = ["Claimable", "claim_keys"]


@immutable
class Claimable:
    """What a push needs to claim its request against a dispatcher's standing ticket: a plain pool's
    request (not fair) in a group in lists mode (``lua/push.lua``, ``lua/admit_push.lua``)."""

    group_id: str
    producer_id: str
    lease_member: str


def claim_keys(keys: KeySpace, pool_id: str, claimable: Claimable) -> list[str]:
    """The keys of a ticket's claim: ticket list, producer alive key, pool lease zset, group lease zset,
    durable envelopes hash."""
    group_id = claimable.group_id
    return [
        keys.tickets(pool_id), keys.producer_alive(claimable.producer_id), keys.pool_inflight(pool_id),
        keys.group_inflight(group_id), keys.durable_leases(group_id),
    ]  # fmt: skip
