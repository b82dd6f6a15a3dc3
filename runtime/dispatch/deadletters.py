"""Dead letters: requests that used up their attempts, parked in ``list:llm:dead:{pool_id}``.

A dead letter keeps the envelope as it was last queued, why it died (``attempts_exhausted`` or
``requeues_exhausted``), the last error and when. The dispatcher adds them (inside its own scripts,
atomically with releasing the lease); an operator lists them and replays (back at the tail of the
pool's list as a fresh first attempt, without its old deadline) or discards them. Replay and discard
name the exact stored bytes, so two operators acting on the same letter act once.

The list operations take a blocking redis-py client: their callers are the admin and commands.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import redis

from runtime.errors import MalformedEnvelope
from runtime.immutable import immutable
from runtime.queue.keys import KeySpace
from runtime.queue.leases import item_digest
from runtime.queue.scripts import DEAD_LETTER_TAKE, TENANT_DEAD_LETTER_TAKE
from runtime.queue.tenant_dispatch import dead_letter_take_fair_args
from runtime.wire.contract import Envelope

# An operator acts on letters the admin listed; letters past this many are reached after the first go.
FIND_LIMIT = 10_000
ATTEMPTS_EXHAUSTED = "attempts_exhausted"
REQUEUES_EXHAUSTED = "requeues_exhausted"


@immutable
class DeadLetter:
    """One dead request: its envelope, why it died, its last error and when."""

    envelope: bytes
    request_id: str
    pool_id: str
    reason: str
    error_type: str
    error_message: str
    attempts: int
    dead_at: float

    def encode(self) -> bytes:
        return orjson.dumps({**dataclasses.asdict(self), "envelope": self.envelope.decode()})

    @classmethod
    def decode(cls, raw: bytes) -> DeadLetter:
        try:
            data: Any = orjson.loads(raw)
            return cls(
                envelope=str(data["envelope"]).encode(),
                request_id=str(data["request_id"]),
                pool_id=str(data["pool_id"]),
                reason=str(data["reason"]),
                error_type=str(data["error_type"]),
                error_message=str(data["error_message"]),
                attempts=int(data["attempts"]),
                dead_at=float(data["dead_at"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise MalformedEnvelope(f"dead letter is unreadable: {exc}") from exc

    @classmethod
    def of(
        cls, envelope: Envelope, *, reason: str, error_type: str, error_message: str, now: float
    ) -> DeadLetter:
        return cls(
            envelope=envelope.encode(),
            request_id=envelope.request_id,
            pool_id=envelope.pool_id,
            reason=reason,
            error_type=error_type,
            error_message=error_message,
            attempts=envelope.attempt,
            dead_at=now,
        )


@immutable
class StoredLetter:
    """A dead letter as listed, with the exact bytes that replay and discard name."""

    raw: bytes
    letter: DeadLetter | None  # None: unreadable bytes (still discardable)

    @property
    def digest(self) -> str:
        """Names this exact letter in a form an operator posts back (unreadable ones too)."""
        return item_digest(self.raw)


@immutable
class DeadLetterSummary:
    pool_id: str
    count: int
    oldest_dead_at: float | None


def replayed_envelope(letter: DeadLetter) -> bytes:
    """The envelope a replay queues: a fresh first attempt with no deadline (the old one has passed)."""
    envelope = Envelope.decode(letter.envelope)
    return dataclasses.replace(envelope, attempt=1, requeues=0, deadline=None).encode()


def dead_letters(
    client: redis.Redis, keys: KeySpace, pool_id: str, *, limit: int = 200
) -> list[StoredLetter]:
    """The oldest ``limit`` dead letters of a pool."""
    letters = []
    stored: list[bytes] = client.lrange(keys.dead_letters(pool_id), 0, limit - 1)  # type: ignore[assignment]
    for raw in stored:
        try:
            letters.append(StoredLetter(raw, DeadLetter.decode(raw)))
        except MalformedEnvelope:
            letters.append(StoredLetter(raw, None))
    return letters


def summaries(client: redis.Redis, keys: KeySpace, pool_ids: list[str]) -> list[DeadLetterSummary]:
    """Count and oldest death of each pool's dead letters, in one round trip."""
    with client.pipeline(transaction=False) as pipe:
        for pool_id in pool_ids:
            pipe.llen(keys.dead_letters(pool_id))
            pipe.lindex(keys.dead_letters(pool_id), 0)
        results = pipe.execute()
    found = []
    for i, pool_id in enumerate(pool_ids):
        count, oldest = int(results[2 * i]), results[2 * i + 1]
        found.append(DeadLetterSummary(pool_id, count, _dead_at(oldest)))
    return found


def _dead_at(raw: bytes | None) -> float | None:
    if raw is None:
        return None
    try:
        return DeadLetter.decode(raw).dead_at
    except MalformedEnvelope:
        return None


def find(client: redis.Redis, keys: KeySpace, pool_id: str, digest: str) -> StoredLetter | None:
    """The dead letter with this :attr:`StoredLetter.digest` in a pool, if it is still there."""
    for stored in dead_letters(client, keys, pool_id, limit=FIND_LIMIT):
        if stored.digest == digest:
            return stored
    return None


def replay(
    client: redis.Redis, keys: KeySpace, pool_id: str, stored: StoredLetter, *, fair: bool = False
) -> bool:
    """Queues the letter again in ``pool_id``, the pool whose dead-letter list holds it; False if it
    was no longer there. In a ``fair`` pool (tenant_fairness on) it goes back to its tenant's list.

    The list is authoritative, not the envelope's ``pool_id``: a request served in another lane than
    the one it names died there, and its letter is only found (and replayed) in that lane.
    """
    if stored.letter is None:
        raise MalformedEnvelope("an unreadable dead letter cannot be replayed, only discarded")
    queued = replayed_envelope(stored.letter)
    if fair:
        tenant = Envelope.decode(queued).tenant
        script_keys, args = dead_letter_take_fair_args(keys, pool_id, stored.raw, queued, tenant)
        return bool(int(client.eval(TENANT_DEAD_LETTER_TAKE, len(script_keys), *script_keys, *args)))
    return _take(client, keys, pool_id, stored.raw, queued)


def discard(client: redis.Redis, keys: KeySpace, pool_id: str, stored: StoredLetter) -> bool:
    """Removes the letter for good; False if it was no longer there."""
    return _take(client, keys, pool_id, stored.raw, b"")


def _take(client: redis.Redis, keys: KeySpace, pool_id: str, raw: bytes, queued: bytes) -> bool:
    """Runs ``lua/dead_letter_take.lua``: the exact stored letter out, ``queued`` (if any) in its pool."""
    taken = client.eval(DEAD_LETTER_TAKE, 2, keys.dead_letters(pool_id), keys.requests(pool_id), raw, queued)
    return bool(int(taken))
