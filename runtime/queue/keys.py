"""Every Valkey key, channel and stream name of LLM Dispatch, and their default TTLs.

The first three names are the wire contract shared with producers and other tools; keep them.
Everything else here is the runtime's own bookkeeping. An optional prefix wraps every name so that
several installations can share one server; it is empty by default.
"""

from __future__ import annotations

from runtime.immutable import immutable

# Liveness: a dead producer is noticed within one TTL; the producer refreshes several times per TTL.
PRODUCER_ALIVE_TTL_S = 12.0
PRODUCER_ALIVE_REFRESH_S = 3.0
# Replies for a producer that never comes back expire instead of piling up.
REPLY_LIST_TTL_S = 60.0
# A dispatcher's in-flight lease: a killed dispatcher leaks its slots for at most this long.
INFLIGHT_LEASE_S = 15.0
# The latest snapshot of each dispatcher; a dead dispatcher disappears when it lapses.
SNAPSHOT_TTL_S = 10.0
# The elected scraper of a backend holds its lease this long and renews it every scrape, so a
# killed scraper is replaced within one lease.
SCRAPE_LEASE_MS = 2_000
# A backend's shared load outlives its scraper only briefly: older values are stale anyway.
BACKEND_LOAD_TTL_S = 30.0
# A shared breaker state is kept this long after its last change (a closed, quiet one lapses).
BREAKER_TTL_S = 24 * 3600.0
# Spans wait here for the history ingester; the stream is trimmed (and the trim counted) past this.
SPAN_STREAM_MAXLEN = 200_000
# The tenant of untagged traffic in a fair pool (its requests stay on the seed's list); never a tenant id.
UNTAGGED = "*"


@immutable
class KeySpace:
    """Builds key names; ``prefix`` (e.g. ``"prod:"``) is prepended to every one."""

    prefix: str = ""

    # --- wire contract -------------------------------------------------------------------------
    def requests(self, pool_id: str) -> str:
        return f"{self.prefix}list:llm:requests:{pool_id}"

    def replies(self, producer_id: str) -> str:
        return f"{self.prefix}list:llm:replies:{producer_id}"

    def producer_alive(self, producer_id: str) -> str:
        return f"{self.prefix}key:llm:producer:{producer_id}:alive"

    def dead_letters(self, pool_id: str) -> str:
        """Requests of one pool that exhausted their attempts, oldest first, for an operator."""
        return f"{self.prefix}list:llm:dead:{pool_id}"

    # --- fairness between a pool's tenants (issue 22; only pools with tenant_fairness on) --------
    def tenant_requests(self, pool_id: str, tenant: str) -> str:
        """One tenant's queued envelopes in a fair pool; tenant ``*`` (untagged) is the seed's list. A
        distinct prefix: nothing that matches ``list:llm:requests:*`` sees these."""
        if tenant == UNTAGGED:
            return self.requests(pool_id)
        return f"{self.prefix}list:llm:tenant-requests:{pool_id}:{tenant}"

    def tenants(self, pool_id: str) -> str:
        """Sorted set of a fair pool's backlogged tenants, scored by their virtual counter."""
        return f"{self.prefix}zset:llm:tenants:{pool_id}"

    def tenant_counters(self, pool_id: str) -> str:
        """Hash tenant -> virtual counter (idle tenants too); field ``*last``: the last leaver's."""
        return f"{self.prefix}hash:llm:tenant-counters:{pool_id}"

    def tenant_weights(self, pool_id: str) -> str:
        """Hash tenant -> weight, written by each submit from its key's ``tenant_weight``."""
        return f"{self.prefix}hash:llm:tenant-weights:{pool_id}"

    def tenant_served(self, pool_id: str) -> str:
        """Hash tenant -> the (unweighted) cost it was served, added by each completed call's FINISH: its
        usage's cost, or its estimate when the backend reported none (the operator's per-tenant
        metrics read its top tenants)."""
        return f"{self.prefix}hash:llm:tenant-served:{pool_id}"

    def tenant_scan(self, pool_id: str) -> str:
        """The HSCAN cursor of a fair pool's idle cleanup of its counters hash."""
        return f"{self.prefix}key:llm:tenant-scan:{pool_id}"

    def pool_queued(self, pool_id: str) -> str:
        """Requests queued in a fair pool across all its lists (summing LLENs is O(tenants))."""
        return f"{self.prefix}key:llm:queued:{pool_id}"

    # --- runtime bookkeeping -------------------------------------------------------------------
    def replies_taken(self, producer_id: str) -> str:
        """Replies a producer's pump took from its reply list and has not yet acknowledged as delivered."""
        return f"{self.prefix}list:llm:replies:{producer_id}:taken"

    def replies_acked(self, producer_id: str) -> str:
        """The sequence number of the pump's last acknowledgement (a replayed one trims nothing twice)."""
        return f"{self.prefix}key:llm:replies:{producer_id}:acked"

    def wake_list(self, pool_id: str) -> str:
        """Wake-up tokens of a pool: pushed with a request or a freed slot, BLPOPed by one idle dispatcher."""
        return f"{self.prefix}list:llm:wake:{pool_id}"

    def tickets(self, pool_id: str) -> str:
        """Standing claim tickets of a pool's idle dispatchers, oldest first (runtime.dispatch.tickets)."""
        return f"{self.prefix}list:llm:tickets:{pool_id}"

    def inbox(self, dispatcher_id: str, pool_id: str) -> str:
        """Requests a push claimed against a dispatcher's ticket, waiting for that dispatcher's BLPOP."""
        return f"{self.prefix}list:llm:inbox:{dispatcher_id}:{pool_id}"

    def schedule_turn(self, group_id: str) -> str:
        """Short lease of the dispatcher whose scheduling round is running (one at a time per group)."""
        return f"{self.prefix}key:llm:turn:{group_id}"

    def schedule_again(self, group_id: str) -> str:
        """Note left by a dispatcher that found the turn taken: the holder runs one more round."""
        return f"{self.prefix}key:llm:turn-again:{group_id}"

    def group_fleet(self, group_id: str) -> str:
        """Sorted set of the group's dispatchers (score: membership expiry), refreshed each round."""
        return f"{self.prefix}zset:llm:fleet:{group_id}"

    def group_poll(self, group_id: str) -> str:
        """Short marker of the group's last idle poll: the fleet polls as often as one dispatcher."""
        return f"{self.prefix}key:llm:poll:{group_id}"

    def cancel_channel(self, group_id: str) -> str:
        """Pub/sub channel carrying request ids whose producer gave up while they run."""
        return f"{self.prefix}chan:llm:cancel:{group_id}"

    def group_inflight(self, group_id: str) -> str:
        """Sorted set of in-flight leases of a group (member: pool + request id, score: expiry)."""
        return f"{self.prefix}zset:llm:inflight:{group_id}"

    def pool_inflight(self, pool_id: str) -> str:
        """Sorted set of in-flight leases of one pool, across all dispatchers."""
        return f"{self.prefix}zset:llm:inflight-pool:{pool_id}"

    def delayed(self, pool_id: str) -> str:
        """Sorted set of one pool's retries waiting for their due time (member: envelope, score: due)."""
        return f"{self.prefix}zset:llm:delayed:{pool_id}"

    def durable_leases(self, group_id: str) -> str:
        """Hash lease member -> the envelope to requeue if the lease expires (durable mode)."""
        return f"{self.prefix}hash:llm:durable:{group_id}"

    def lease_tokens(self, group_id: str) -> str:
        """Hash lease member -> the fencing token of the claim that holds it (durable mode)."""
        return f"{self.prefix}hash:llm:lease-token:{group_id}"

    def fencing_counter(self, group_id: str) -> str:
        """Counter handing out each claim's fencing token."""
        return f"{self.prefix}key:llm:fence:{group_id}"

    def lease_records(self, group_id: str) -> str:
        """Hash lease member -> what a claim knew of its request, so a lease that expires because
        its dispatcher died can still be counted and written to history as ``lost_in_flight``."""
        return f"{self.prefix}hash:llm:leases:{group_id}"

    def group_config(self, group_id: str) -> str:
        """JSON of the group's published configuration (policy, pools, endpoints)."""
        return f"{self.prefix}key:llm:config:{group_id}"

    def config_channel(self, group_id: str) -> str:
        """Pub/sub channel announcing that the group's configuration changed."""
        return f"{self.prefix}chan:llm:config:{group_id}"

    def pool_registry(self) -> str:
        """Hash pool_id -> group_id of every enabled pool, checked by producers at submit."""
        return f"{self.prefix}hash:llm:pools"

    def config_restored(self) -> str:
        """Hash of the last republication of the configuration to a Valkey that had lost it
        (``at``, ``by``, ``groups``), shown on the dashboard."""
        return f"{self.prefix}hash:llm:config:restored"

    def counters(self, group_id: str) -> str:
        """Hash of the group's cumulative counters (drops by reason, completions, failures)."""
        return f"{self.prefix}hash:llm:counters:{group_id}"

    def snapshot(self, group_id: str, dispatcher_id: str) -> str:
        return f"{self.prefix}key:llm:snapshot:{group_id}:{dispatcher_id}"

    def snapshot_pattern(self, group_id: str) -> str:
        return f"{self.prefix}key:llm:snapshot:{group_id}:*"

    # --- backends (shared by every group and dispatcher that uses them) -------------------------
    def backend_load(self, backend_id: str) -> str:
        """JSON of the backend's last scraped load (runtime.backends.metrics.BackendLoad)."""
        return f"{self.prefix}key:llm:backend-load:{backend_id}"

    def backend_scrape_lease(self, backend_id: str) -> str:
        """Lease (SET NX PX) of the one process of the fleet that scrapes the backend."""
        return f"{self.prefix}key:llm:backend-scraper:{backend_id}"

    def backend_inflight(self, backend_id: str) -> str:
        """Sorted set of in-flight leases to one backend, across every group and dispatcher."""
        return f"{self.prefix}zset:llm:inflight-backend:{backend_id}"

    def backend_hold(self, backend_id: str) -> str:
        """Set (PX: the Retry-After) while a backend's 429 asks the fleet to wait; PTTL is what is left."""
        return f"{self.prefix}key:llm:backend-hold:{backend_id}"

    def backend_breaker(self, backend_id: str) -> str:
        """JSON of the backend's circuit-breaker state, shared by the fleet."""
        return f"{self.prefix}key:llm:breaker:{backend_id}"

    # --- admission ------------------------------------------------------------------------------
    def pool_drain(self, pool_id: str) -> str:
        """Hash of per-second counts of requests that left the pool's queue (its drain rate)."""
        return f"{self.prefix}hash:llm:drain:{pool_id}"

    def key_open(self, key_id: str) -> str:
        """Sorted set of an ingress key's open requests (lease members scored by lease expiry), fleet-wide:
        its most-in-flight and most-queued limits count these."""
        return f"{self.prefix}zset:llm:key-open:{key_id}"

    def rejections(self) -> str:
        """Hash ``{pool_id}:{reason}`` -> submits refused by admission control."""
        return f"{self.prefix}hash:llm:rejections"

    def span_stream(self) -> str:
        return f"{self.prefix}stream:llm:spans"

    def span_trim_counter(self) -> str:
        return f"{self.prefix}key:llm:spans:trimmed"


DEFAULT_KEYS = KeySpace()

# Wake tokens (see runtime.dispatch.wakeup): one pending token per pool is enough: the dispatcher it
# wakes takes every launch it can, and a dispatcher waiting at the time of the push takes the token
# at once, leaving room for the next.
WAKE_TOKEN_CAP = 1
# A token nobody takes (no dispatcher running) lapses instead of lingering.
WAKE_TOKEN_TTL_MS = 5_000
# A push that makes its pool's list non-empty wakes a dispatcher with the request itself as the token
# (up to this size; a bigger one wakes with "1"), so that the dispatcher claims it in its first round
# trip instead of reading the head first (runtime.dispatch.wakeup). The claim still checks the list's
# real head by digest. One token per pool at most: this bounds the copy.
WAKE_HEAD_MAX_BYTES = 65_536
# A standing claim ticket is posted again before every BLPOP of its dispatcher's wake waiter (at most
# runtime.dispatch.wakeup.WAKE_BLOCK_S apart): one a stopped or killed dispatcher left lapses after
# this, and so does an inbox nobody takes from (REAP requeues what it held).
TICKET_TTL_MS = 2_000
# A pool's drain hash outlives the ring's window by far: a stalled pool's last drain must still be known.
DRAIN_TTL_S = 3600
# The open-requests set of an ingress key nobody uses any more goes away after this (its members
# expire far sooner).
KEY_SET_TTL_S = 3600
