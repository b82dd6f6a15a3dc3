"""One round trip per decision: ROUND (``lua/round.lua``) reads what the next decision needs.

The dispatcher decides from the observation its previous round trip brought back, and sends the
claims of that decision with ROUND behind them in one pipeline: the claims re-check every hard
condition (the digest of the peeked head, liveness, caps, protected slots), and ROUND reads the heads
and counts the next decision needs, taking the group's scheduling turn for it only when that
observation lets this dispatcher launch something. A dispatcher that finds the turn taken reads
nothing (it leaves a note, and the holder's release wakes one of the fleet), so a fleet spends no
reads on rounds that decide nothing.

Fair pools (tenant fairness on, issue 22) are read by tenant in the same script: a fair pool's W
lowest backlogged tenants and their first heads, as TENANT_OBSERVE reads them
(``lua/_tenant_view.lua``), so a group with fair pools decides in one round trip too, and its turn is
taken and given back by ROUND like any other group's (the turn is taken only when some fair pool's
view holds a tenant to launch from).

Plain data and the script's KEYS/ARGV, no I/O: :class:`runtime.queue.dispatching.QueueOps` runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import Any

from runtime.immutable import immutable
from runtime.policy.reads import PoolRead
from runtime.queue import turn
from runtime.queue.dispatch_requests import QueueView, ScriptArgs
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace
from runtime.queue.tenant_dispatch import FairView, parse_view, view_keys, view_width

__all__ = ["TURN_ELSEWHERE", "TURN_NONE", "TURN_OURS", "NextRound", "RoundSeen", "parse_round", "round_args"]

TURN_OURS = 1  # the observation allows a launch: this dispatcher decides next, nobody else meanwhile
TURN_NONE = 0  # it allows none: the turn was given back
TURN_ELSEWHERE = -1  # another dispatcher holds the turn: nothing was read


@immutable
class NextRound:
    """What ROUND reads for the next decision, and who asks."""

    holder: str  # the dispatcher id
    reads: tuple[PoolRead, ...]
    local_slots: int  # this dispatcher's slots, registered in the fleet
    free: int  # its free slots once the claims sent before ROUND succeed
    group_limit: int
    wake_pool: str  # a pool of the group, whose wake list gets a token for another dispatcher
    left_work: bool = False  # the decision before left work for other dispatchers' slots
    fair: frozenset[str] = frozenset()  # the pools read by tenant


@immutable
class RoundSeen:
    """ROUND's answer."""

    turn: int  # TURN_OURS, TURN_NONE or TURN_ELSEWHERE
    fleet_slots: tuple[int, ...]  # local slots of each dispatcher of the group
    group_in_flight: int
    views: dict[str, QueueView]  # empty with TURN_ELSEWHERE; a fair pool's heads empty (see ``fair``)
    fair: dict[str, FairView] = field(default_factory=dict)  # each fair pool's tenants, for the plan


def round_args(keys: KeySpace, group_id: str, nxt: NextRound) -> ScriptArgs:
    """KEYS and ARGV of ``lua/round.lua`` (which declares them)."""
    script_keys = [
        keys.schedule_turn(group_id),
        keys.schedule_again(group_id),
        keys.group_fleet(group_id),
        keys.group_inflight(group_id),
        keys.wake_list(nxt.wake_pool),
    ]
    args: list[Any] = [
        nxt.holder,
        turn.TURN_LEASE_MS,
        turn.FLEET_MEMBER_S,
        f"{nxt.holder} {nxt.local_slots}",
        max(0, nxt.free),
        nxt.group_limit,
        "1" if nxt.left_work else "0",
        WAKE_TOKEN_CAP,
        WAKE_TOKEN_TTL_MS,
    ]
    for read in nxt.reads:
        if read.pool_id in nxt.fair:
            pool_keys, prefix = view_keys(keys, read.pool_id)
            script_keys += pool_keys
            args += ["f", read.depth, read.pool_max, int(read.display_head), view_width(read.depth), prefix]
            continue
        script_keys += [keys.requests(read.pool_id), keys.pool_inflight(read.pool_id)]
        args += ["p", read.depth, read.pool_max, int(read.display_head)]
    return script_keys, args


def parse_round(
    reads: Sequence[PoolRead], answer: Sequence[Any], fair: frozenset[str] = frozenset()
) -> RoundSeen:
    """ROUND's answer for the ``reads`` it was sent (``fair``: the pools it read by tenant)."""
    code, fleet, in_group, *pools = answer
    fleet_slots = tuple(int(member.rsplit(b" ", 1)[-1]) for member in fleet)
    views: dict[str, QueueView] = {}
    if int(code) == TURN_ELSEWHERE:
        return RoundSeen(TURN_ELSEWHERE, fleet_slots, 0, views)
    fair_views: dict[str, FairView] = {}
    for read, (backlog, in_flight, heads_read, heads, *horizon) in zip(reads, pools, strict=True):
        if read.pool_id in fair:
            fair_views[read.pool_id] = parse_view(heads, horizon[0])
            views[read.pool_id] = QueueView(int(backlog), (), int(in_flight), heads_read == 1)
        elif heads_read == 2:  # the first item, read only to show its age
            views[read.pool_id] = QueueView(int(backlog), (), int(in_flight), False, heads[0])
        else:
            views[read.pool_id] = QueueView(int(backlog), tuple(heads), int(in_flight), bool(heads_read))
    return RoundSeen(int(code), fleet_slots, int(in_group), views, fair_views)
