"""One scheduling round at a time per fabric group: the fleet decides as one scheduler would.

Dispatchers that run rounds at the same moment peek the same heads and race to claim them; the
losers refund their credit and run again (about one lost claim per completion with three
dispatchers). A short turn lease serialises the *decisions* only, while calls run in every process in
parallel. ROUND (``lua/round.lua``, :mod:`runtime.queue.deciding`), sent behind each decision's
claims, takes it for the next decision when its observation allows a launch and gives it back when
it allows none, so it costs no round trip of its own; a dispatcher that finds it taken reads nothing.
Groups with fair pools do the same (ROUND reads a fair pool by tenant).

Each round also reads the fleet (dispatchers that ran a round lately, with their local slots), so
that a dispatcher keeps to its share of the group's slots (:func:`runtime.policy.scheduler.fleet_share`,
even for equal dispatchers): otherwise the one whose calls just finished takes every freed slot, and
three dispatchers split work 7/47/46 %.

A dispatcher that finds the turn taken leaves a note (``again``); when the holder gives the turn back,
the note becomes a wake token, so whatever woke the other one gets a round. A holder cut short by its
own free slots wakes an idle dispatcher for the rest the same way. Correctness never depends on the turn (the
claim script checks everything atomically); a holder that dies only delays others by the lease.

The steps are ``lua/round.lua``, and ``lua/turn_release.lua`` (behind the claims of a decision that
sends no ROUND: it launched nothing), run by :class:`runtime.queue.dispatching.QueueOps`.
"""

from __future__ import annotations

# Longer than a round, even on a busy machine; a dead holder delays the others this long at most.
TURN_LEASE_MS = 200

# A dispatcher counts as part of the fleet this long after its last round.
FLEET_MEMBER_S = 3.0
