"""The queue's scripts by name, and the codes they answer with.

Each constant is the runnable source of one ``lua/<name>.lua`` (see :mod:`runtime.queue.registry`);
the file's header declares its KEYS, ARGV and result. Run them as
``registry.script(name)`` (one :class:`~runtime.valkey.lua.LuaScript` per process) or wrap the source.

Dispatcher side (see :mod:`runtime.queue.dispatching`): OBSERVE reads one pool's backlog and lease
count, and its head items only when the pool could launch at all: a pool at its cap (or a group at
its total) costs a few bytes per round however large its queued envelopes are. Its first item is read
for display only when the dispatcher asks (it has none cached for the pool), so the oldest pending age
stays visible at the cost of one read.

CLAIM takes exactly the request the dispatcher peeked: it compares the SHA-1 of the list head with
the peeked bytes, so a request taken by another dispatcher in between is never run under the wrong
cost. A launch refuses a second copy of a request that already holds a lease in the pool (caps count
running calls, and a copy would share the original's lease), checks the producer's liveness, the
hard caps and the protected slots of the group's other pools against the fleet-wide counts of that
instant, and records an in-flight lease with what it knows of the request in the same step; a drop
just removes the item.

Expired leases are reaped only by REAP, which hands back their records: a lease that expires
because its dispatcher died is a lost call, and it is counted, not silently forgotten.

In ``durable`` mode the claim also stores the envelope to requeue (its next attempt) and a fencing
token beside the lease: REAP puts an expired durable lease's request back at the head of its list
instead of losing it, and FINISH refuses a dispatcher whose token is no longer the lease's (its lease
expired and the request went back), so a stale dispatcher cannot reply, retry or dead-letter it.
"""

from __future__ import annotations

from runtime.queue.registry import source

# --- dispatcher side -------------------------------------------------------------------------------
OBSERVE = source("observe")
CLAIM = source("claim")
FINISH = source("finish")
RENEW = source("renew")
RELET = source("relet")  # a lease its own (starved) dispatcher reaped, given back while the call runs
REAP = source("reap")
PROMOTE = source("promote")
BURY = source("bury")
TURN_RELEASE = source("turn_release")
ROUND = source("round")  # an observation and the turn for the next decision (runtime.queue.deciding)
RELAY = source("relay")
SCRAPE_LEASE = source("scrape_lease")
SCRAPE_RELEASE = source("scrape_release")
WAKE = source("wake")  # the wake-token push on its own
DRAIN = source("drain")  # the drain count on its own
TENANT_OBSERVE = source("tenant_observe")  # a fair pool's (issue 22; see runtime.queue.tenant_dispatch)
TENANT_CLAIM = source("tenant_claim")
TENANT_PROMOTE = source("tenant_promote")
TENANT_FORGET = source("tenant_forget")
TENANT_BURY = source("tenant_bury")
ANSWER_GONE = source("answer_gone")  # error replies for calls dropped as producer_gone (never run)
GIVE_BACK = source("give_back")  # undoes a launch claim whose answer was lost (runtime.queue.unanswered)
TICKET_RETURN = source("ticket_return")  # a request claimed against a ticket, given back unrun
TENANT_DEAD_LETTER_TAKE = source("tenant_dead_letter_take")

# --- producer side ---------------------------------------------------------------------------------
PUSH = source("push")
ADMIT_PUSH = source("admit_push")
KEY_LEASE_RENEW = source("key_lease_renew")
READ_REGISTRY = source("read_registry")
WITHDRAW = source("withdraw")
TAKE_REPLIES = source("take_replies")
# A fair pool's (tenant_fairness on, issue 22; see runtime.queue.tenants)
TENANT_PUSH = source("tenant_push")
TENANT_PUSH_PLAIN = source("tenant_push_plain")
TENANT_WITHDRAW = source("tenant_withdraw")

# --- operators and tools ---------------------------------------------------------------------------
DEAD_LETTER_TAKE = source("dead_letter_take")
GROUP_PUBLISH = source("group_publish")
GROUP_UNPUBLISH = source("group_unpublish")
SPANS_ADD = source("spans_add")
SPANS_TRIM_ACKED = source("spans_trim_acked")

CLAIMED = "claimed"
CLAIM_MOVED = "moved"
CLAIM_DROPPED = "dropped"
CLAIM_DUPLICATE = "duplicate"
CLAIM_PRODUCER_GONE = "producer_gone"
CLAIM_POOL_CAP = "pool_cap"
CLAIM_GROUP_CAP = "group_cap"
CLAIM_RESERVED = "reserved"
CLAIM_BACKEND_CAP = "backend_cap"  # the backend's in-flight limit; the dispatcher names the reason
CLAIM_BACKEND_HELD = "backend_held"  # the backend's 429 Retry-After hold

FINISH_DELIVERED = 1
FINISH_PRODUCER_GONE = 0
FINISH_STALE = -1
FINISH_DELAYED = 2
FINISH_REQUEUED = 3

RELAY_STALE = -1

# How FINISH settles an attempt: reply to the producer, store its retry, or store its dead letter.
SETTLE_REPLY = "reply"
SETTLE_RETRY = "retry"
SETTLE_DEAD = "dead"
SETTLE_REQUEUE = "requeue"  # durable mode: back at the head of the pool's list (shutdown)

# Due retries moved per pool and promotion; the rest follow on the next one.
PROMOTE_BATCH = 256
