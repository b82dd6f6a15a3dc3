"""The finishing half of the dispatcher's Valkey operations: FINISH, and the fixed keys of each call.

Finishing a request (liveness check, reply, lease release, waking one idle dispatcher, a fair pool's
charge corrected) is one script; the finishes that happen together go in one pipeline
(:class:`~runtime.valkey.batch.ScriptBatcher`). :class:`Finishing` is a part of
:class:`~runtime.queue.dispatching.QueueOps`, kept in a module of its own; the attributes it reads are
declared here and set by ``QueueOps``.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.queue import scripts
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace
from runtime.queue.tenant_dispatch import FairPick, finish_fair_args
from runtime.valkey.batch import ScriptBatcher

__all__ = ["CALL_KEYS_KEPT", "Finishing"]

# CLAIM and FINISH key tuples kept (pool, producer, backend): producers come and go, so the cache is bounded.
CALL_KEYS_KEPT = 4096


class Finishing:
    """FINISH and the per-call keys CLAIM shares with it (see the module doc)."""

    keys: KeySpace
    fair_pools: frozenset[str]
    charges: dict[str, tuple[str, FairPick]]
    _corrections: dict[str, tuple[float, float]]
    _finishes: ScriptBatcher
    _call_keys_of: dict[tuple[str, str, str], tuple[tuple[str, ...], ...]]
    _group_inflight: str
    _lease_records: str
    _tokens: str
    _durable: str
    _fence: str
    _turn: str
    _again: str

    @property
    def finishes(self) -> ScriptBatcher:
        """The batcher of finish scripts: its ``calls`` and ``batches`` show how finishes share trips."""
        return self._finishes

    async def finish(
        self,
        *,
        pool_id: str,
        producer_id: str,
        member: str,
        reply: bytes,
        reply_ttl_s: float,
        group_pools: Sequence[str] = (),
        token: str = "",
        settlement: str = scripts.SETTLE_REPLY,
        payload: bytes = b"",
        due_at: float = 0.0,
        backend_id: str = "",
    ) -> int:
        """Releases the lease (and the backend's) and delivers the reply if the producer is alive, or
        stores the retry or dead letter ``settlement`` names (or requeues ``payload`` at the head of the
        pool's list); one of the ``scripts.FINISH_*`` codes.

        With a fencing ``token`` nothing happens unless the lease is still this claim's
        (``FINISH_STALE``). While one of ``group_pools`` has backlog, the freed slot wakes one idle
        dispatcher of the group.
        """
        # A fair pool's request going back goes to its tenant's list (lua/_tenant_requeue.lua), and a
        # charged call's correction rides in the same script (lua/_tenant_correct.lua). Taken out
        # before the call: a FINISH retried after a lost answer may have run, so it corrects at most once.
        charged = self.charges.pop(member, None)
        correction, served = self._corrections.pop(member, (0.0, 0.0))
        fair = pool_id in self.fair_pools or charged is not None
        pick = charged[1] if charged is not None else None
        code = await self._finishes.run(
            [*self._call_keys(pool_id, producer_id, backend_id)[1], *map(self._backlog_key, group_pools)],
            [
                reply, int(reply_ttl_s * 1000), member, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, token, settlement,
                payload, due_at,
                *(finish_fair_args(self.keys, pool_id, pick, correction, served) if fair else ()),
            ],
        )  # fmt: skip
        return int(code)

    def _call_keys(self, pool_id: str, producer_id: str, backend_id: str) -> tuple[tuple[str, ...], ...]:
        """CLAIM's and FINISH's fixed keys: the same for every call of a pool, producer and backend, so
        each pair of tuples is built once (fifteen key names a call otherwise)."""
        known = self._call_keys_of.get((pool_id, producer_id, backend_id))
        if known is not None:
            return known
        if len(self._call_keys_of) >= CALL_KEYS_KEPT:
            self._call_keys_of.clear()
        requests, pool_inflight = self.keys.requests(pool_id), self.keys.pool_inflight(pool_id)
        alive = self.keys.producer_alive(producer_id)
        backend_inflight = self.keys.backend_inflight(backend_id)
        claim = (
            requests, self._group_inflight, pool_inflight, alive, self._lease_records, self._tokens,
            self._durable, self._fence, backend_inflight, self.keys.pool_drain(pool_id),
            self.keys.backend_hold(backend_id),
        )  # fmt: skip
        finish = (
            alive, self.keys.replies(producer_id), self._group_inflight, pool_inflight, self._lease_records,
            self.keys.wake_list(pool_id), self._tokens, self._durable, self.keys.delayed(pool_id),
            self.keys.dead_letters(pool_id), backend_inflight, requests, self._turn, self._again,
        )  # fmt: skip
        known = self._call_keys_of[(pool_id, producer_id, backend_id)] = (claim, finish)
        return known

    def _backlog_key(self, pool_id: str) -> str:
        """A key that exists exactly while the pool has backlog: its list, or a fair pool's tenants."""
        return self.keys.tenants(pool_id) if pool_id in self.fair_pools else self.keys.requests(pool_id)

    def stage_correction(self, member: str, correction: float, served: float) -> None:
        """Sets what the FINISH of one of this dispatcher's running fair-pool calls adds to its tenant's
        counter, ``correction`` (unweighted: actual minus estimate; 0 keeps the estimate) / its weight,
        and to what the tenant was ``served`` (unweighted)."""
        if member in self.charges:
            self._corrections[member] = (correction, served)

    def charged(self, member: str) -> FairPick | None:
        """The pick of one of this dispatcher's running fair-pool calls (None: not a fair pool's)."""
        charged = self.charges.get(member)
        return charged[1] if charged is not None else None
