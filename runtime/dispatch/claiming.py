"""Claiming what a round decided: one pipeline of atomic CLAIM scripts, the turn given back or ROUND
behind them, and each claimed request handed to the dispatcher's ``_start``.

Caps, the other pools' protected slots and the producer's liveness are checked inside each claim; a
claim that finds its producer gone drops the request and its producer is told so
(:func:`~runtime.dispatch.drops.gone_reply`). :class:`Claiming` is a part of
:class:`~runtime.dispatch.dispatcher.Dispatcher` (through :class:`~runtime.dispatch.rounds.Rounds`),
kept in a module of its own; the attributes it reads are declared here and set by the dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from runtime.backends.breaker import BLOCKED_REASON
from runtime.backends.gate import SKIP_BACKEND_RETRY_AFTER
from runtime.dispatch import redelivery
from runtime.dispatch.drops import gone_reply
from runtime.dispatch.observing import Observing
from runtime.dispatch.peek import PeekedItem
from runtime.dispatch.stats import DROP_DUPLICATE, DROP_PRODUCER_GONE
from runtime.errors import DispatchError
from runtime.policy import scheduler
from runtime.queue import scripts
from runtime.queue.dispatching import ClaimRequest, TurnEnd, lease_member
from runtime.queue.leases import LeaseRecord
from runtime.valkey.client import REDIS_ERRORS
from runtime.wire.contract import Envelope

__all__ = ["CLAIM_DROPS", "Claiming"]

# Claim outcomes that take the item off its queue without running it, and the drop reason of each.
CLAIM_DROPS = {scripts.CLAIM_PRODUCER_GONE: DROP_PRODUCER_GONE, scripts.CLAIM_DUPLICATE: DROP_DUPLICATE}
GONE = scripts.CLAIM_PRODUCER_GONE

log = logging.getLogger(__name__)


class Claiming(Observing):
    """The claim half of a round (see the module doc)."""

    _state: scheduler.SchedulerState
    _stopping: asyncio.Event
    _start: Callable[..., None]  # runs a claimed request (the dispatcher's execution half)
    _internal_error: Callable[[str], None]  # counts and logs a failure of the round

    async def _claim(
        self,
        policy: scheduler.GroupPolicy,
        launches: tuple[scheduler.Launch, ...],
        peeked: dict[str, list[PeekedItem]],
        protected: tuple[tuple[str, int], ...],
        end_turn: TurnEnd | None,
        ahead_free: int | None = None,
        *,
        hinted: bool = False,
        fair: frozenset[str] = frozenset(),
    ) -> tuple[int, bool]:
        """Claims the decided launches; caps and the other pools' protected slots are checked in the
        claim, and the same pipeline gives the scheduling turn back. With ``ahead_free`` (the local
        free slots this decision had) ROUND follows the claims instead, reading the next decision's
        observation into ``queue.ahead`` (the pools in ``fair`` by tenant).

        Returns how many were claimed, and whether the claim dropped any (duplicate, producer gone).
        """
        assert self.config is not None
        if self._stopping.is_set():  # a stop requested during this round takes no more work
            launches = ()
        caps = {p.pool_id: p.max_concurrent for p in policy.pools} if launches else {}
        own = dict(protected)
        chosen: list[tuple[scheduler.Launch, PeekedItem, ClaimRequest, str]] = []  # ..., endpoint
        claimed_at = time.time()
        for launch in launches:
            item = peeked[launch.pool_id][launch.index]
            envelope = item.envelope
            assert envelope is not None
            route = self.config.route(launch.pool_id)
            backend_id, endpoint = route.backend_id, route.endpoint
            allowed = self.fleet.acquire_now(backend_id, endpoint)
            if allowed is None:
                allowed = await self.fleet.acquire(backend_id, endpoint)
            if not allowed:
                scheduler.refund(self._state, launch)
                self.stats.skips[(launch.pool_id, BLOCKED_REASON)] += 1
                continue
            request = ClaimRequest(
                pool_id=launch.pool_id,
                raw=item.raw,
                mode="launch",
                lease_member=lease_member(launch.pool_id, envelope.request_id),
                producer_id=envelope.producer_id,
                pool_max=caps[launch.pool_id],
                group_limit=policy.total_concurrency,
                lease_record=LeaseRecord.encode_of(
                    envelope,
                    pool_id=launch.pool_id,
                    claimed_at=claimed_at,
                    dispatcher_id=self.identity.dispatcher_id,
                    cost=launch.cost,
                ),
                protected=own.get(launch.pool_id, 0),
                reserved_for=tuple(p for p in protected if p[0] != launch.pool_id) if protected else (),
                requeue=redelivery.requeued(envelope).encode() if self.config.durable else b"",
                backend_id=backend_id,
                backend_limit=self.fleet.limit(backend_id) if backend_id else None,
            )
            chosen.append((launch, item, request, endpoint))
        if not chosen and end_turn is None:
            return 0, False
        behind = chosen and self._round_behind(hinted)
        then = self._then(policy, ahead_free, len(chosen), fair) if behind else None
        try:
            results = await self.queue.claim(
                [request for _, _, request, _ in chosen], self.settings.lease_s, end_turn=end_turn, then=then,
                backend_ids=sorted(self.fleet.backends),
            )  # fmt: skip
        except BaseException:
            for _, _, request, endpoint in chosen:
                await self.fleet.release(request.backend_id, endpoint)
            raise
        claimed, dropped = 0, False
        for (launch, item, request, endpoint), (code, _, token) in zip(chosen, results, strict=True):
            claimed += code == scripts.CLAIMED
            dropped = dropped or code in CLAIM_DROPS
            if code != scripts.CLAIMED:  # the call will not happen: its breaker slot goes back
                await self.fleet.release(request.backend_id, endpoint)
            try:
                self._after_claim(launch, item, request, code, token, hinted=hinted)
            except Exception:  # the other claimed requests of this round still start
                self._internal_error(f"handling the claim of an item of pool {launch.pool_id} failed")
                if code == scripts.CLAIMED and request.lease_member not in self.running:
                    assert item.envelope is not None
                    refused = DispatchError("internal dispatcher error before the call started")
                    self._start(item.envelope, launch.pool_id, request.lease_member, launch.cost, refused)
        await self._answer_gone([c[1].envelope for c, r in zip(chosen, results, strict=True) if r[0] == GONE])
        return claimed, dropped

    async def _answer_gone(self, envelopes: list[Envelope | None]) -> None:
        """Tells the producers of calls dropped as producer_gone that they were not run (their callers
        fail at once, not at their timeouts), after the claimed calls started. Lost if Valkey fails
        now: the caller then times out, as every such drop did before."""
        now = time.time()
        replies = [(e.producer_id, gone_reply(e, now)) for e in envelopes if e is not None]
        if not replies:
            return
        try:
            await self.queue.answer_gone(replies, self.settings.reply_ttl_s)
        except REDIS_ERRORS as exc:
            log.warning("could not answer %d calls dropped as producer_gone: %s", len(replies), exc)

    def _after_claim(
        self,
        launch: scheduler.Launch,
        item: PeekedItem,
        request: ClaimRequest,
        code: str,
        token: str = "",
        *,
        hinted: bool = False,
    ) -> None:
        envelope = item.envelope
        assert envelope is not None and self.config is not None
        if hinted:  # what the next wake token's claim expects (Observing._round_behind); 1: unknown
            self._hinted_left = self.queue.backlog_after_claim.get(launch.pool_id, 1)
        if code == scripts.CLAIMED:
            self._peek.forget(item.raw)
            self._start(envelope, launch.pool_id, request.lease_member, launch.cost, token=token)
            return
        scheduler.refund(self._state, launch)
        if code in CLAIM_DROPS:
            self._peek.forget(item.raw)
            self.drops.dropped(envelope, CLAIM_DROPS[code], cost=launch.cost)
        elif code in (scripts.CLAIM_POOL_CAP, scripts.CLAIM_GROUP_CAP, scripts.CLAIM_RESERVED):
            self.stats.skips[(launch.pool_id, code)] += 1
        elif code == scripts.CLAIM_BACKEND_CAP:
            self.stats.skips[(launch.pool_id, self.fleet.skip_reason(request.backend_id))] += 1
        elif code == scripts.CLAIM_BACKEND_HELD:  # held since the reading the round decided from
            self.stats.skips[(launch.pool_id, SKIP_BACKEND_RETRY_AFTER)] += 1
            self.fleet.read_again()
        elif hinted:  # the token's request was taken since (by this dispatcher's own round, mostly)
            self._peek.forget(item.raw)
            self.stats.stale_tokens += 1
        else:
            self._peek.forget(item.raw)
            self.stats.claim_lost += 1
