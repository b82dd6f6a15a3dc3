"""The dispatcher's scheduling round: decide with the pure scheduler, claim, and read what is next.

One round is one round trip (issue 23). It decides from the observation the previous round's claim
pipeline brought back when that one took the group's turn (else from a fresh one:
:mod:`runtime.dispatch.observing`): decodes and screens the peeked heads (dropping the unusable,
burying durable requests requeued too often), asks :func:`runtime.policy.scheduler.decide` which
heads may launch, and claims exactly those with an atomic script, ROUND behind them in the same
pipeline reading the next decision's heads and counts (:mod:`runtime.queue.deciding`), a fair pool's
by tenant (planned in its tenants' order by :mod:`runtime.dispatch.tenant_round`); the claims are
:mod:`runtime.dispatch.claiming`'s. Each claimed request is handed to the dispatcher's ``_start``.

:class:`Rounds` is a part of :class:`~runtime.dispatch.dispatcher.Dispatcher`, kept in a module of
its own; the attributes it reads are declared here and set by the dispatcher.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping

from runtime.backends.breaker import BLOCKED_REASON
from runtime.backends.gate import SKIP_BACKEND_CAP, SKIP_BACKEND_RETRY_AFTER, SKIP_BACKEND_SATURATED
from runtime.dispatch import tenant_round
from runtime.dispatch.claiming import Claiming
from runtime.dispatch.peek import PeekedItem, usable_heads
from runtime.dispatch.tickets import Tickets
from runtime.policy import scheduler
from runtime.policy.reads import unread_skip
from runtime.queue import scripts
from runtime.queue.dispatching import ClaimRequest, Observation, QueueView, TurnEnd

__all__ = ["BACKEND_REFUSALS", "DEAD_LETTER", "Rounds"]

# The refusals that come from a pool's backend: the scheduler sees the pool blocked for that reason.
BACKEND_REFUSALS = frozenset(
    {BLOCKED_REASON, SKIP_BACKEND_SATURATED, SKIP_BACKEND_CAP, SKIP_BACKEND_RETRY_AFTER}
)
# Screening's reason for a durable request put back by expired leases more often than its pool allows.
DEAD_LETTER = "dead_letter"
Drop = tuple[str, PeekedItem, str]  # (the pool whose list holds it, the item, the drop reason)

log = logging.getLogger(__name__)


class Rounds(Claiming):
    """The round's half of the dispatcher (see the module doc); its observations are :class:`Observing`'s,
    its claims :class:`~runtime.dispatch.claiming.Claiming`'s."""

    _policy: scheduler.GroupPolicy | None
    _head_token: tuple[str, bytes] | None  # the last wake token's request (pool id, bytes), if any
    _slots: int
    _wake: asyncio.Event  # set: the scheduling loop runs a round rather than wait
    tickets: Tickets  # this dispatcher's standing claim tickets

    async def schedule_round(self) -> bool:
        """One decide → claim round; True if the round left work a round of its own should take.

        That is: a request left a queue without running (dropped), or requests were claimed and
        launchable work is left (the claim pipeline's ROUND saw it, and took the turn for it). The
        round decides from the observation its previous claim pipeline read when that one took the
        turn, else from a fresh one. It runs only in the group's scheduling turn; every path that took
        the turn gives it back in a claim pipeline (a round that fails midway leaves it to lapse after
        :data:`runtime.queue.turn.TURN_LEASE_MS`).
        """
        assert self._policy is not None and self.config is not None
        self.stats.rounds += 1
        await self.give_back_unanswered()
        policy = self._policy
        # A standing ticket holds a slot: its push's claim may start a call at any moment.
        planned_free = max(0, self._slots - len(self.running) - self.tickets.holding())
        await self.fleet.refresh_unless_fresh()  # mostly read by the last pipeline (queue.riding)
        plan = self._plan(policy, planned_free)
        # A pool whose backend has no room is refused for the backend's own reason (breaker open,
        # saturated, at its max in flight).
        refusals = {
            pool_id: (self._refusal(pool_id) or reason) if reason == BLOCKED_REASON else reason
            for pool_id, reason in plan.refusals.items()
        }
        holder = self.identity.dispatcher_id if policy.pools else ""
        fair = tenant_round.fair_pools(self.config, self.queue)
        ahead = bool(holder)  # one round trip per decision (runtime.queue.deciding)
        seen = self._ahead_seen(policy, fair)
        token, self._head_token = self._head_token, None
        hinted = False
        if seen is None and token is not None:  # a wake token's request, claimed at once if it may be
            seen = self._hinted_view(policy, plan, token, fair)
            hinted = seen is not None
        if seen is None:
            seen = await self._observe(policy, plan, planned_free, holder, fair)
            if seen is None:
                self.stats.turn_busy += 1
                return False  # another dispatcher is deciding; the note we left makes it run once more
        observations, peeked, drops = self._screen(policy, seen.views, refusals, time.time())
        if ahead and not hinted and not self.queue.has_turn:
            return False  # ROUND saw nothing this dispatcher could launch, and gave the turn back
        dropped = await self._drop(drops) if drops else False
        # Keep to our share of the group's slots, so the fleet splits the work evenly.
        own = self.settings.concurrency
        self._slots = scheduler.fleet_share(policy.total_concurrency, own, self.queue.fleet_slots or (own,))
        # Heads were read only if the plan saw a free slot: with none then, nothing launches now.
        local_free = min(planned_free, max(0, self._slots - len(self.running)))
        group_room = self.group_in_flight < policy.total_concurrency
        end_turn = None
        if holder and not hinted:  # a claim from a wake token is made without the turn
            # Work left because our own slots are full: the turn's release wakes another dispatcher.
            cut = local_free == 0 and any(v.backlog > 0 for v in seen.views.values())
            end_turn = TurnEnd(holder=holder, left_work=group_room and cut, wake_pool=policy.pools[0].pool_id)
        if local_free == 0 or not group_room:
            # Nothing can launch, and no heads were read: a DRR walk over head-less pools would
            # only advance its round and hand out quanta nobody earned.
            if end_turn is not None:
                await self.queue.claim([], self.settings.lease_s, end_turn=end_turn)
            return dropped
        decision = scheduler.decide(
            policy,
            self._state,
            observations,
            group_in_flight=self.group_in_flight,
            local_free_slots=local_free,
        )
        self._state = decision.state
        self._learn_depths(policy, seen.views, decision.launches, fair)
        self.stats.skips.update(decision.skips)
        if end_turn is not None and any(r == scheduler.SKIP_LOCAL_CAPACITY for _, r in decision.skips):
            end_turn = dataclasses.replace(end_turn, left_work=True)
        protected = tuple(
            (p.pool_id, min(p.min_concurrent, p.max_concurrent))
            for p in policy.pools
            if p.min_concurrent > 0 and not p.paused and not observations[p.pool_id].blocked
        )
        free = local_free if ahead else None
        stale = self.stats.claim_lost + self.stats.stale_tokens
        claimed, claim_dropped = await self._claim(
            policy, decision.launches, peeked, protected, end_turn, free, hinted=hinted, fair=fair
        )
        after = self.queue.ahead
        if after is not None:  # the claims' own ROUND read the next observation
            self._plan_fair(after)
            await self._absorb(after)
            if not self.queue.has_turn:
                return dropped  # it allows nothing now: pushes and finishes bring the next round
            # Claims of heads taken meanwhile (a stale wake token's, mostly): the observation that came
            # back with them is fresh, and shows work to launch.
            if claimed or claim_dropped or self.stats.claim_lost + self.stats.stale_tokens > stale:
                return True
            # Nothing came of the claims: give the turn back rather than claim the same heads again.
            self.queue.ahead = None
            release = TurnEnd(holder=holder, left_work=False, wake_pool=policy.pools[0].pool_id)
            await self.queue.claim([], self.settings.lease_s, end_turn=end_turn or release)
            return dropped
        # Run again at once only if this round may have left launchable work behind (e.g. more
        # backlog than peeked). With the group full, FINISH tokens bring the next round; with our own
        # slots full, the turn's release woke another dispatcher. Rounds of our own beyond that would
        # take every freed slot for the finisher, and the work would not spread over the fleet.
        room = self.group_in_flight + claimed < policy.total_concurrency and local_free > claimed
        more = (
            self._after_hinted_claim(seen, token, claimed, room, stale)  # sent without ROUND behind it
            if hinted
            else claimed > 0 and room and self._backlog_may_remain(seen.views)
        )
        return dropped or claim_dropped or more

    async def give_back_unanswered(self) -> None:
        """The requests of claim pipelines cut off unanswered (a frozen Valkey) whose claims ran after
        all go back to their lists: their calls never started, and their leases would otherwise expire
        as calls lost in flight (see runtime.queue.unanswered). Before each round, and at each lease
        renewal (an idle dispatcher runs no rounds)."""
        given_back = await self.queue.give_back_unanswered(self.settings.lease_s)
        if given_back:
            self._wake.set()  # back at the head of its list: a round takes it
            self.stats.claims_given_back += given_back
            log.warning(
                "dispatcher %s gave back %d requests whose claims ran after their answers were lost",
                self.identity.dispatcher_id,
                given_back,
            )

    def _ahead_seen(self, policy: scheduler.GroupPolicy, fair: frozenset[str]) -> Observation | None:
        """The observation the last claims' ROUND read, when it took the turn for this decision and read
        the pools this round decides for (the fair ones by tenant). Read for another configuration (a
        pool added, fairness switched), it is dropped: a fresh ROUND reads this one, still holding the
        turn (ROUND keeps it for its holder), so nobody waits for its lease."""
        seen = self.queue.ahead if self.queue.has_turn else None
        self.queue.ahead = None
        if seen is None or frozenset(seen.fair) != fair:
            return None
        return seen if seen.views.keys() == {p.pool_id for p in policy.pools} else None

    def _after_hinted_claim(
        self, seen: Observation, token: tuple[str, bytes] | None, claimed: int, room: bool, stale: int
    ) -> bool:
        """Takes in what a wake token's claim says of its pool, the backlog its pop left; True when a
        round of its own should follow: backlog left (no push brings a token for it) and room to
        launch it, or a claim that took nothing of a stale token (a fresh ROUND reads the list)."""
        assert token is not None
        pool_id = token[0]
        left = self.queue.backlog_after_claim.get(pool_id)
        if not claimed or left is None:
            return self.stats.claim_lost + self.stats.stale_tokens > stale
        view = seen.views[pool_id]
        self.group_in_flight = seen.group_in_flight + claimed
        self.last_views = {**seen.views, pool_id: QueueView(left, (), view.in_flight + claimed)}
        self._remember_heads(pool_id, self.last_views[pool_id])
        return left > 0 and room

    def _backlog_may_remain(self, views: dict[str, QueueView]) -> bool:
        """False when every pool's list was empty as of this round: its observation, or, for a pool
        claimed from, the claim's own count right after the pop. A push after either makes a list
        non-empty and so brings a wake token: a round now would only find nothing (issue 13)."""
        assert self._policy is not None
        left = self.queue.backlog_after_claim
        for pool in self._policy.pools:
            view = views.get(pool.pool_id)
            if view is None or left.get(pool.pool_id, view.backlog) > 0:
                return True
        return False

    def _backend_id(self, pool_id: str) -> str:
        return self.config.route(pool_id).backend_id if self.config else ""

    def _refusal(self, pool_id: str) -> str | None:
        """Why the pool's backend takes nothing now (breaker, saturation, cap); None when it may."""
        assert self.config is not None
        route = self.config.route(pool_id)
        return self.fleet.refusal(route.backend_id, route.endpoint)

    def _screen(
        self,
        policy: scheduler.GroupPolicy,
        views: Mapping[str, QueueView],
        refusals: Mapping[str, str],
        now: float,
    ) -> tuple[dict[str, scheduler.PoolObservation], dict[str, list[PeekedItem]], list[Drop]]:
        """What the scheduler sees of each pool, its usable heads, and the unusable heads to drop.

        The list an item sits in is authoritative: an item whose ``pool_id`` names another pool
        (moved between lanes by an operator) is served, or dropped, in the list it was read from.
        """
        observations: dict[str, scheduler.PoolObservation] = {}
        peeked: dict[str, list[PeekedItem]] = {}
        drops: list[Drop] = []
        for pool in policy.pools:
            pool_id, view = pool.pool_id, views[pool.pool_id]
            refusal = refusals.get(pool_id)
            if not view.heads_read and view.backlog > 0:
                self.stats.skips[(pool_id, unread_skip(pool, view.in_flight, refusal))] += 1
            heads, unusable = usable_heads(self._peek, view.heads, now)
            if unusable is not None:
                drops.append((pool_id, *unusable))
            heads = self._below_requeue_limit(pool_id, heads, drops)
            peeked[pool_id] = heads
            observations[pool_id] = scheduler.PoolObservation(
                pool_id=pool_id,
                backlog=view.backlog,
                in_flight=view.in_flight,
                blocked=refusal if refusal in BACKEND_REFUSALS else None,
                heads=tuple(i.head for i in heads if i.head is not None),
            )
        return observations, peeked, drops

    def _below_requeue_limit(
        self, pool_id: str, heads: list[PeekedItem], drops: list[Drop]
    ) -> list[PeekedItem]:
        """Heads up to the first durable request requeued too often; that one, at the very head, is buried."""
        for i, item in enumerate(heads):
            if item.envelope is not None and self.redeliveries.exhausted(self.config, item.envelope):
                if i == 0:
                    drops.append((pool_id, item, DEAD_LETTER))
                return heads[:i]
        return heads

    async def _drop(self, drops: list[Drop]) -> bool:
        """Removes unusable heads from the lists they were read from; True if any was removed."""
        removed = False
        for pool_id, item, _ in (d for d in drops if d[2] == DEAD_LETTER):
            self._peek.forget(item.raw)
            assert item.envelope is not None
            removed = await self.redeliveries.bury(pool_id, item.raw, item.envelope) or removed
        drops = [d for d in drops if d[2] != DEAD_LETTER]
        requests = [ClaimRequest(pool_id=pool_id, raw=item.raw, mode="drop") for pool_id, item, _ in drops]
        results = await self.queue.claim(requests, self.settings.lease_s) if requests else []
        for (pool_id, item, reason), (code, _, _) in zip(drops, results, strict=True):
            self._peek.forget(item.raw)
            if code != scripts.CLAIM_DROPPED:
                continue
            removed = True
            if item.envelope is None:
                self.drops.malformed(pool_id, item.error)
            else:
                self.drops.dropped(item.envelope, reason)
        return removed
