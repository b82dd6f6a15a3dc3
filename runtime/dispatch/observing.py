"""The dispatcher's observations: what each round decides from, and what else they say.

A round decides from the observation its previous claim pipeline brought back (ROUND behind the
claims, :mod:`runtime.queue.deciding`) when that one took the turn; else from a fresh ROUND (which
reads a fair pool by tenant too); or, for a dispatcher alone in its group woken by a push, from the
wake token's own request (:mod:`runtime.dispatch.wakeup`). Every observation also brings
the group's counts, the heads to show, and the leases its reap found expired.

:class:`Observing` is a part of :class:`~runtime.dispatch.dispatcher.Dispatcher` (through
:class:`~runtime.dispatch.rounds.Rounds`); the attributes it reads are declared here.
"""

from __future__ import annotations

from runtime.backends.fleet import BackendFleet
from runtime.config import DispatcherSettings
from runtime.dispatch import redelivery, tenant_round
from runtime.dispatch.drops import DropRecorder
from runtime.dispatch.execution import Executor
from runtime.dispatch.peek import PeekCache
from runtime.dispatch.running import Running, RunningCalls
from runtime.dispatch.stats import DispatcherStats
from runtime.policy import scheduler
from runtime.policy.reads import PoolRead, ReadPlan, base_depth, next_depth, plan_reads
from runtime.policy.tenants import OFF
from runtime.queue.deciding import TURN_ELSEWHERE, NextRound
from runtime.queue.dispatching import Observation, QueueOps, QueueView
from runtime.queue.leases import LeaseRecord, lease_member
from runtime.telemetry.spans import Identity
from runtime.wire.groupconfig import GroupConfig

__all__ = ["Observing"]


class Observing:
    """The observation half of a round (see the module doc)."""

    settings: DispatcherSettings
    config: GroupConfig | None
    queue: QueueOps
    fleet: BackendFleet
    stats: DispatcherStats
    drops: DropRecorder
    redeliveries: redelivery.Redeliveries
    executor: Executor
    identity: Identity
    running: RunningCalls
    finishing: dict[str, Running]
    group_in_flight: int
    last_views: dict[str, QueueView]
    _peek: PeekCache
    _heads_seen: dict[str, tuple[bytes, ...]]
    _deeper: dict[str, int]  # pools read deeper than peek_depth (runtime.policy.reads.next_depth)
    _hinted_left = 1  # the backlog the last wake token's claim left in its list (1: none made yet)

    def _hinted_view(
        self, policy: scheduler.GroupPolicy, plan: ReadPlan, token: tuple[str, bytes], fair: frozenset[str]
    ) -> Observation | None:
        """The observation a wake token stands for, when its request may be claimed at once without
        reading the heads first: its request at the head of an otherwise empty group, this lone
        dispatcher's own calls in flight (the claim checks the real counts). Only for a dispatcher
        alone in its group (as last seen), the token's pool not refused and every other pool empty as
        last seen, so that no decision but this launch was possible (nothing to be fair about). In a
        fair pool the claim also checks that the token's tenant is the pool's pick; a pool read by
        tenant only until its leftovers drain (fairness switched off) takes no hint."""
        pool_id, raw = token
        if len(self.queue.fleet_slots) > 1 or pool_id in plan.refusals:
            return None
        if not any(p.pool_id == pool_id for p in policy.pools):
            return None
        if any(v.backlog for p, v in self.last_views.items() if p != pool_id):
            return None
        self.queue.fair_picks = {}
        if pool_id in fair:
            assert self.config is not None
            configured = self.config.pool(pool_id)
            if configured is None or configured.tenant_fairness == OFF:
                return None
            hint = tenant_round.token_pick(self._peek, configured, raw)
            if hint is None:
                return None
            raw, pick = hint
            self.queue.fair_picks = {pool_id: {raw: pick}}
        in_pool = self.running.in_pool
        views = {
            p.pool_id: QueueView(1, (raw,), in_pool(p.pool_id))
            if p.pool_id == pool_id
            else QueueView(0, (), in_pool(p.pool_id))
            for p in policy.pools
        }
        self.group_in_flight = len(self.running)
        return Observation(views, self.group_in_flight, ())

    def _round_behind(self, hinted: bool) -> bool:
        """Whether ROUND follows a decision's claims. Not behind a wake token's claim made while idle
        (no call of this dispatcher running) when the last such claim left its list empty: a lone
        dispatcher, every other pool empty as last seen, then learns from the claim itself what ROUND
        would read, the backlog its pop left. None: a push makes the list non-empty, and so sends the
        next token; some (pushed meanwhile, behind the token's request: no token), and a round of its
        own follows, one round trip more than ROUND behind the claim would have cost. So ROUND stays
        while calls run (a busy stretch, where pushes land behind the token's request: at
        concurrency 16, skipping it cost throughput), after a claim that left backlog, when the
        reap is due (ROUND also renews the fleet membership, every REAP_INTERVAL_S) and while the
        turn is ours. At concurrency 1 that is one script and ten commands less per call."""
        if not hinted or self.queue.has_turn or self.queue.reap_due:
            return True
        return bool(self.running) or self._hinted_left > 0

    def _plan(self, policy: scheduler.GroupPolicy, local_free: int) -> ReadPlan:
        return plan_reads(
            policy,
            peek_depth=self.settings.peek_depth,
            local_free=local_free,
            allowances={p.pool_id: self._room(p.pool_id) for p in policy.pools},
            heads_cached=frozenset(pool_id for pool_id, heads in self._heads_seen.items() if heads),
            deeper=self._deeper,
        )

    def _learn_depths(
        self,
        policy: scheduler.GroupPolicy,
        views: dict[str, QueueView],
        launches: tuple[scheduler.Launch, ...],
        fair: frozenset[str],
    ) -> None:
        """How deep to read each pool next, from what this decision launched of the heads it read
        (a fair pool's heads are read by tenant, at the configured depth)."""
        base = base_depth(policy, self.settings.peek_depth)
        launched: dict[str, int] = {}
        for launch in launches:
            launched[launch.pool_id] = launched.get(launch.pool_id, 0) + 1
        for pool_id, view in views.items():
            if not view.heads or pool_id in fair:
                continue
            took = launched.get(pool_id, 0)
            depth = next_depth(
                self._deeper.get(pool_id, base),
                base=base,
                read=len(view.heads),
                launched=took,
                backlog_left=view.backlog - took,
                read_bytes=sum(map(len, view.heads)),
            )
            if depth > base:
                self._deeper[pool_id] = depth
            else:
                self._deeper.pop(pool_id, None)

    def _then(
        self, policy: scheduler.GroupPolicy, free: int | None, claims: int, fair: frozenset[str]
    ) -> NextRound | None:
        """ROUND after ``claims`` claims, when deciding from the previous observation (``free`` given)."""
        if free is None:
            return None
        free -= claims
        return self._next_round(policy, self._plan(policy, free).reads, free, fair)

    def _next_round(
        self, policy: scheduler.GroupPolicy, reads: tuple[PoolRead, ...], free: int, fair: frozenset[str]
    ) -> NextRound:
        return NextRound(
            holder=self.identity.dispatcher_id,
            reads=reads,
            local_slots=self.settings.concurrency,
            free=free,
            group_limit=policy.total_concurrency,
            wake_pool=policy.pools[0].pool_id,
            fair=fair,
        )

    async def _observe(
        self, policy: scheduler.GroupPolicy, plan: ReadPlan, free: int, holder: str, fair: frozenset[str]
    ) -> Observation | None:
        """A fresh observation, and the turn for its decision; None when another dispatcher holds it."""
        assert self.config is not None
        backend_ids = sorted(self.fleet.backends)
        if not holder:  # a group without pools: nothing to decide, nobody to take turns with
            seen = await self.queue.observe(
                plan.reads, policy.total_concurrency, backend_ids=backend_ids, fair=fair
            )
            await self._absorb(seen)
            return seen
        seen = await self.queue.round(self._next_round(policy, plan.reads, free, fair), backend_ids)
        self._plan_fair(seen)
        await self._absorb(seen)
        return None if self.queue.turn == TURN_ELSEWHERE else seen

    def _plan_fair(self, seen: Observation) -> None:
        """A fair pool's heads, in its tenants' order (issue 22), in place of its head-less view."""
        if seen.fair:
            assert self.config is not None
            tenant_round.plan_fair(self.queue, self._peek, self.config, seen, self.settings.peek_depth)

    async def _absorb(self, seen: Observation) -> None:
        """Takes in what an observation says beyond the decision: the group's counts, the heads to
        show, and the leases its reap found expired."""
        if seen.lost:  # reaped by this observe, whether or not the turn is ours: counted here or nowhere
            await self._lost(seen.lost)
        if seen.requeued:  # likewise for durable requests the reap put back
            self.redeliveries.requeued(seen.requeued)
        if not seen.views:  # ROUND found the turn taken and read nothing
            return
        self.group_in_flight, self.last_views = seen.group_in_flight, seen.views
        for pool_id, view in seen.views.items():
            self._remember_heads(pool_id, view)

    async def _lost(self, records: tuple[LeaseRecord, ...]) -> None:
        """Expired leases nobody requeued: calls lost in flight, and durable streams interrupted after
        their first chunk (answered ``stream_interrupted``)."""
        # A call of ours whose lease expired while Valkey was away is counted by its own FINISH.
        self.drops.lost(r for r in records if not r.streamed and not self.executor.settles(r))
        # ... and, still running, it gets its lease back: should this dispatcher die before the call
        # ends, whoever reaps the lease then counts the loss (before, nobody did: the record was gone).
        await self.queue.relet(self._still_ours(records), self.settings.lease_s)
        streamed = [r for r in records if r.streamed]
        if streamed:
            await self.redeliveries.interrupted(streamed, self.executor.relay.answer)

    def _still_ours(self, records: tuple[LeaseRecord, ...]) -> list[tuple[str, str, str, bytes]]:
        """The reaped leases of calls this dispatcher still runs unfenced (lists mode), to give back."""
        ours = []
        for record in records:
            if record.dispatcher_id != self.identity.dispatcher_id:
                continue
            member = lease_member(record.pool_id, record.request_id)
            run = self.running.get(member) or self.finishing.get(member)
            if run is not None and not run.token:
                ours.append((run.pool_id, member, run.backend_id, record.encode()))
        return ours

    def _room(self, pool_id: str) -> int | None:
        """Most heads offered for the pool: nothing is claimed that its backend would refuse."""
        assert self.config is not None
        route = self.config.route(pool_id)
        return self.fleet.room(route.backend_id, route.endpoint)

    def _remember_heads(self, pool_id: str, view: QueueView) -> None:
        """Heads last read per pool, for the snapshot's oldest-pending age while a pool sits at its cap."""
        if view.heads_read or view.backlog == 0:
            self._heads_seen[pool_id] = view.heads
        elif view.display_head is not None:
            self._heads_seen[pool_id] = (view.display_head,)
