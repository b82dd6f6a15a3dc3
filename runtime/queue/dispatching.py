"""Valkey operations of the dispatcher: observe the queues, claim exactly what was peeked, finish.

Each operation is one round trip: observation is one pipeline over every pool of the group, a batch
of claims is one pipeline of atomic scripts (reads a round wants as fresh as its observation, the
backends' statuses, ride at the end of each of a round's pipelines: :attr:`QueueOps.riding`), and
finishing a request (liveness check, reply, lease release, waking one idle dispatcher) is one
script, the finishes that happen together sent in one pipeline (:mod:`runtime.queue.finishing`).
Scripts run by SHA (loaded once, reloaded on NOSCRIPT), so no pipeline pays redis-py's SCRIPT
EXISTS round trip.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import redis.asyncio as aioredis

from runtime.policy.reads import PoolRead
from runtime.queue import scripts
from runtime.queue.deciding import TURN_OURS, NextRound, parse_round, round_args
from runtime.queue.dispatch_requests import (
    ClaimRequest,
    Observation,
    QueueView,
    ScriptArgs,
    TurnEnd,
    bury_args,
    promote_args,
    reap_args,
)
from runtime.queue.finishing import Finishing
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace
from runtime.queue.leases import LeaseRecord, item_digest, lease_member
from runtime.queue.registry import script
from runtime.queue.tenant_dispatch import (
    FairPick,
    FairView,
    claim_keys,
    forget_call,
    leftover_backlog,
    observe_call,
    parse_view,
)
from runtime.queue.unanswered import UnansweredClaim, give_back_args
from runtime.queue.upkeep import Upkeep
from runtime.valkey.batch import ScriptBatcher
from runtime.valkey.lua import LuaScript, RidingReads, run_pipeline

__all__ = [
    "HEADS_FOR_DISPLAY",
    "REAP_INTERVAL_S",
    "ClaimRequest",
    "Observation",
    "QueueOps",
    "QueueView",
    "ScriptArgs",
    "TurnEnd",
    "bury_args",
    "item_digest",
    "lease_member",
    "promote_args",
    "reap_args",
]


# Expired leases (a killed dispatcher's) are reaped at observation at most this often: lease expiry is
# measured in seconds, so reaping on every round would only add work to the hot path.
REAP_INTERVAL_S = 0.25
HEADS_FOR_DISPLAY = 2  # OBSERVE read only the first item, to show its age


class QueueOps(Upkeep, Finishing):
    """The dispatcher's view of Valkey for one fabric group."""

    def __init__(self, client: aioredis.Redis, keys: KeySpace, group_id: str) -> None:
        self.client = client
        self.keys = keys
        self.group_id = group_id
        self._group_inflight = keys.group_inflight(group_id)
        self._lease_records = keys.lease_records(group_id)
        self._observe = script("observe")
        self._claim = script("claim")
        self._finishes = ScriptBatcher(client, script("finish"))
        self._renew = script("renew")
        self._relet = script("relet")
        self._reap = script("reap")
        self._round = script("round")
        self.turn = 0  # the last ROUND's turn code (runtime.queue.deciding)
        # The observation the last claim pipeline's ROUND read, for the next decision (None: not sent).
        self.ahead: Observation | None = None
        self._release = script("turn_release")
        self._turn = keys.schedule_turn(group_id)
        self._again = keys.schedule_again(group_id)
        self._poll = keys.group_poll(group_id)
        self._fleet = keys.group_fleet(group_id)
        self.fleet_slots: tuple[int, ...] = ()  # local slots of each dispatcher of the group, as last seen
        self._reaped_at = float("-inf")
        self.has_turn = False  # whether the last observe took the group's scheduling turn
        self.trips = 0  # round trips of the scheduling rounds (observe, ROUND, claim pipelines)
        self.riding: RidingReads | None = None  # reads sent at the end of each of those pipelines
        self.rounds_sent = 0  # ROUND scripts sent, on their own or behind claims
        self._durable = keys.durable_leases(group_id)
        self._tokens = keys.lease_tokens(group_id)
        self._call_keys_of: dict[tuple[str, str, str], tuple[tuple[str, ...], ...]] = {}
        self._fence = keys.fencing_counter(group_id)
        self._promote = script("promote")
        self._bury = script("bury")
        # Per pool, the items its list held right after the last claim pipeline's last launch from it.
        self.backlog_after_claim: dict[str, int] = {}
        # Fair pools (tenant_fairness on, issue 22): which pools are, the planned heads of each (their
        # tenant and charge, set by the round's plan), and the picks of this dispatcher's running calls.
        self.fair_pools: frozenset[str] = frozenset()
        self.fair_backlog: dict[str, int] = {}  # each fair pool's queued count, as last observed
        self.fair_picks: dict[str, dict[bytes, FairPick]] = {}
        self.charges: dict[str, tuple[str, FairPick]] = {}  # lease member -> (pool id, pick)
        self._corrections: dict[str, tuple[float, float]] = {}  # member -> (correction, served), for FINISH
        self._tenant_observe = script("tenant_observe")
        self._tenant_claim = script("tenant_claim")
        self._tenant_promote = script("tenant_promote")
        self._tenant_forget = script("tenant_forget")
        self._tenant_bury = script("tenant_bury")
        # Launch claims sent in a pipeline whose answer was lost: Valkey may have run them (see
        # runtime.queue.unanswered); :meth:`give_back_unanswered` undoes those that ran. Each maps to
        # the monotonic time it stops being watched (inf until Valkey first answered for it).
        self.unanswered: dict[UnansweredClaim, float] = {}
        self._give_back = script("give_back")
        self._answer_gone = script("answer_gone")

    async def observe(
        self,
        reads: Sequence[PoolRead],
        group_limit: int,
        *,
        backend_ids: Sequence[str] = (),
        fair: Collection[str] = (),
    ) -> Observation:
        """Backlog, global in-flight and (when the pool could launch) the first heads of each pool,
        the group's in-flight, and the records of leases found expired, without the group's turn (a
        round's observation is ROUND's, :meth:`round`). The pools in ``fair`` (tenant_fairness on) are
        read by tenant: their views' heads stay empty and ``Observation.fair`` holds their tenants.
        """
        self.fair_pools = frozenset(fair)
        reap = self._reap_due()

        def build(pipe: Any) -> None:
            if reap:
                self._queue_reap(pipe, reads, backend_ids)
            for read in reads:
                if read.pool_id in self.fair_pools:
                    self._tenant_observe.queue(
                        pipe,
                        *observe_call(
                            self.keys, read.pool_id, self._group_inflight, read.depth, read.pool_max,
                            group_limit, read.display_head,
                        ),
                    )  # fmt: skip
                    continue
                keys = [self.keys.requests(read.pool_id), self.keys.pool_inflight(read.pool_id)]
                args = [read.depth, read.pool_max, group_limit, int(read.display_head)]
                self._observe.queue(pipe, [*keys, self._group_inflight], args)
            pipe.zcard(self._group_inflight)

        scripts_used = [self._reap, self._tenant_forget, self._observe, self._tenant_observe]
        self.trips += 1
        results = await run_pipeline(self.client, scripts_used, build, self.riding)
        lost, requeued, left, results = self._reaped(reads, results) if reap else ((), (), {}, results)
        views: dict[str, QueueView] = {}
        fair_views: dict[str, FairView] = {}
        for read, (backlog, in_flight, heads_read, heads, *horizon) in zip(reads, results[:-1], strict=True):
            if read.pool_id in self.fair_pools:
                fair_views[read.pool_id] = parse_view(heads, horizon[0])
                views[read.pool_id] = QueueView(int(backlog), (), int(in_flight), heads_read == 1)
            elif heads_read == HEADS_FOR_DISPLAY:
                views[read.pool_id] = QueueView(int(backlog), (), int(in_flight), False, heads[0])
            else:
                views[read.pool_id] = QueueView(int(backlog), tuple(heads), int(in_flight), bool(heads_read))
        self.fair_backlog = {pool_id: views[pool_id].backlog for pool_id in fair_views} | left
        return Observation(views, int(results[-1]), lost, requeued, fair_views)

    def _reap_due(self) -> bool:
        if not self.reap_due:
            return False
        self._reaped_at = time.monotonic()
        return True

    @property
    def reap_due(self) -> bool:
        """Whether the next observation (observe, or a ROUND) would reap expired leases."""
        return time.monotonic() - self._reaped_at >= REAP_INTERVAL_S

    def _unfair(self, reads: Sequence[PoolRead]) -> list[str]:
        """Pools read first come, first served whose tenants' lists may still hold work: a dispatcher
        started after the pool's fairness was switched off never saw it fair (issue 22)."""
        return [r.pool_id for r in reads if r.pool_id not in self.fair_pools]

    def _queue_reap(self, pipe: Any, reads: Sequence[PoolRead], backend_ids: Sequence[str]) -> None:
        pool_ids = [r.pool_id for r in reads]
        self._reap.queue(pipe, *reap_args(self.keys, self.group_id, pool_ids, backend_ids, self.fair_pools))
        self._queue_forgets(pipe, self._unfair(reads))

    def _reaped(
        self, reads: Sequence[PoolRead], results: list[Any]
    ) -> tuple[tuple[LeaseRecord, ...], tuple[bytes, ...], dict[str, int], list[Any]]:
        """What the reap at the front of ``results`` found (lost records, requeued envelopes), the
        leftover tenant backlog of pools read first come, first served, and the rest of ``results``."""
        lost_raw, requeued_raw = results[0]
        records = (LeaseRecord.decode(raw) for raw in lost_raw)
        lost = tuple(r for r in records if r is not None)
        done = 1 + len(self.fair_pools)  # past the idle cleanups
        unfair = self._unfair(reads)
        left = leftover_backlog(unfair, results[done : done + len(unfair)])
        return lost, tuple(requeued_raw), left, results[done + len(unfair) :]

    def _queue_round(self, pipe: Any, nxt: NextRound, backend_ids: Sequence[str], reap: bool) -> None:
        self.fair_pools = nxt.fair  # the reap's idle cleanups and the finishes follow ROUND's fair pools
        if reap:
            self._queue_reap(pipe, nxt.reads, backend_ids)
        self._round.queue(pipe, *round_args(self.keys, self.group_id, nxt))
        self.rounds_sent += 1

    def _round_seen(self, nxt: NextRound, results: list[Any], reap: bool) -> Observation:
        lost, requeued, left, results = self._reaped(nxt.reads, results) if reap else ((), (), {}, results)
        seen = parse_round(nxt.reads, results[-1], nxt.fair)
        if reap or seen.fair:  # as observe: each fair pool's queued count, and the leftovers reap found
            self.fair_backlog = {pool_id: seen.views[pool_id].backlog for pool_id in seen.fair} | left
        self.turn, self.has_turn = seen.turn, seen.turn == TURN_OURS
        if seen.fleet_slots:
            self.fleet_slots = seen.fleet_slots
        return Observation(seen.views, seen.group_in_flight, lost, requeued, seen.fair)

    async def round(self, nxt: NextRound, backend_ids: Sequence[str] = ()) -> Observation:
        """ROUND on its own (``lua/round.lua``, :mod:`runtime.queue.deciding`): the observation for a
        decision, and the turn for it in ``turn``/``has_turn``; the pools in ``nxt.fair`` are read by
        tenant (their views' heads stay empty and ``Observation.fair`` holds their tenants)."""
        reap = self._reap_due()
        self.trips += 1
        results = await run_pipeline(
            self.client,
            [self._reap, self._tenant_forget, self._round],
            lambda p: self._queue_round(p, nxt, backend_ids, reap),
            self.riding,
        )
        return self._round_seen(nxt, results, reap)

    async def claim(
        self,
        requests: Sequence[ClaimRequest],
        lease_s: float,
        *,
        end_turn: TurnEnd | None = None,
        then: NextRound | None = None,
        backend_ids: Sequence[str] = (),
    ) -> list[tuple[str, int, str]]:
        """Runs the claim script for each request in order, in one pipeline: (code, in flight, fencing
        token; "" when unfenced).

        With ``end_turn`` the same pipeline then gives the scheduling turn back (waking another
        dispatcher if one asked for a round meanwhile or work was left). With ``then`` ROUND follows
        the claims instead, and its observation is left in ``ahead``.
        """
        self.ahead = None
        if not requests and end_turn is None and then is None:
            return []
        reap = then is not None and self._reap_due()

        def build(pipe: Any) -> None:
            for req in requests:
                pick = self.fair_picks.get(req.pool_id, {}).get(req.raw)
                keys = [*self._call_keys(req.pool_id, req.producer_id, req.backend_id)[0]]
                args: list[object] = [
                    item_digest(req.raw),
                    req.mode,
                    req.lease_member,
                    lease_s,
                    req.pool_max,
                    req.group_limit,
                    req.lease_record,
                    req.protected,
                    req.requeue,
                    "" if req.backend_limit is None else req.backend_limit,
                ]
                for other, slots in req.reserved_for:
                    keys += [self._backlog_key(other), self.keys.pool_inflight(other)]
                    args.append(slots)
                if pick is None:
                    self._claim.queue(pipe, keys, args)
                    continue
                keys[0], tenant_keys = claim_keys(self.keys, req.pool_id, pick)
                charge = repr(pick.charge) if req.mode == "launch" else "0"
                lead = "1" if pick.from_token else ""
                self._tenant_claim.queue(pipe, [*keys, *tenant_keys], [*args, pick.tenant, charge, lead])
            if then is not None:
                self._queue_round(pipe, then, backend_ids, reap)
            elif end_turn is not None:
                self._release.queue(
                    pipe,
                    [self._turn, self._again, self.keys.wake_list(end_turn.wake_pool)],
                    [end_turn.holder, "1" if end_turn.left_work else "0", WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS],
                )

        used = [self._claim, self._tenant_claim, self._release, self._reap, self._tenant_forget, self._round]
        self.trips += 1
        results = await self._claims_answered(requests, used, build)
        if then is not None:
            self.ahead = self._round_seen(then, results[len(requests) :], reap)
            results = results[: len(requests)]
        elif end_turn is not None:
            results.pop()  # whether someone asked for a round: the release already woke one
            self.has_turn = False
        for req, (code, *_) in zip(requests, results, strict=True):
            pick = self.fair_picks.get(req.pool_id, {}).pop(req.raw, None)
            if pick is not None and req.mode == "launch" and code in (b"claimed", scripts.CLAIMED):
                self.charges[req.lease_member] = (req.pool_id, pick)
        self.backlog_after_claim = {
            req.pool_id: int(left[0])
            for req, (_, _, _, *left) in zip(requests, results, strict=True)
            if left  # only a launch reports the backlog it left
        }
        return [
            (
                code.decode() if isinstance(code, bytes) else str(code),
                int(n),
                str(int(token)) if int(token) else "",
            )
            for code, n, token, *_ in results
        ]

    async def _claims_answered(
        self, requests: Sequence[ClaimRequest], used: Sequence[LuaScript], build: Callable[[Any], None]
    ) -> list[Any]:
        """The claim pipeline's answers. Lost (an error, a cancel), its launches are remembered: Valkey
        may still run them (runtime.queue.unanswered)."""
        try:
            return await run_pipeline(self.client, used, build, self.riding)
        except BaseException:  # the picks are still those the pipeline was built from
            launches = [
                UnansweredClaim(req, self.fair_picks.get(req.pool_id, {}).get(req.raw))
                for req in requests
                if req.mode == "launch"
            ]
            self.unanswered.update(dict.fromkeys(launches, math.inf))
            raise

    async def answer_gone(self, replies: Sequence[tuple[str, bytes]], reply_ttl_s: float) -> None:
        """Queues each (producer id, reply) whatever the producer's liveness (lua/answer_gone.lua): the
        error replies of calls a claim dropped as producer_gone, one script per producer."""
        by_producer: dict[str, list[bytes]] = {}
        for producer_id, reply in replies:
            by_producer.setdefault(producer_id, []).append(reply)

        ttl_ms = int(reply_ttl_s * 1000)

        def build(pipe: Any) -> None:
            for producer_id, items in by_producer.items():
                self._answer_gone.queue(pipe, [self.keys.replies(producer_id)], [ttl_ms, *items])

        await run_pipeline(self.client, [self._answer_gone], build)

    async def give_back_unanswered(self, watch_s: float) -> int:
        """Gives back to the head of its list each request of :attr:`unanswered` whose claim ran after
        all (its lease still this claim's: atomic with that check, so a lease REAP took is not queued
        twice); how many.

        A claim found not run is watched ``watch_s`` (the lease time) past Valkey's first answer: the
        cut connection's bytes may run after a new connection's commands (measured: they do, now and
        then), and a check within the lease catches such a claim before REAP counts it lost.
        """
        if not self.unanswered:
            return 0
        pending = list(self.unanswered)

        def build(pipe: Any) -> None:
            for claim in pending:
                self._give_back.queue(pipe, *give_back_args(self.keys, self.group_id, claim))

        given_back = [int(n) for n in await run_pipeline(self.client, [self._give_back], build)]
        now = time.monotonic()
        for claim, n in zip(pending, given_back, strict=True):
            until = self.unanswered.get(claim)
            if until is None:
                continue  # settled by a give-back that ran meanwhile (the renewal's, the round's)
            if n or now >= until:
                del self.unanswered[claim]
            elif until == math.inf:
                self.unanswered[claim] = now + watch_s
        return sum(given_back)

    def _queue_forgets(self, pipe: Any, unfair: Sequence[str]) -> None:
        """Each fair pool's idle cleanup, a slice of its counters hash at a time (in reap's interval),
        then the queued count of each pool in ``unfair`` (its tenants' lists may hold leftover work)."""
        for pool_id in sorted(self.fair_pools):
            self._tenant_forget.queue(pipe, *forget_call(self.keys, pool_id))
        for pool_id in unfair:
            pipe.get(self.keys.pool_queued(pool_id))
