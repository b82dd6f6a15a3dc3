"""runtime.dispatch.redelivery: settling failed attempts (table); PROMOTE and BURY on real Valkey."""

from __future__ import annotations

import random
import time

import orjson
import pytest

from runtime.dispatch import redelivery
from runtime.dispatch.deadletters import DeadLetter
from runtime.errors import BackendConnectError, BackendHTTPError, BackendTimeout, DispatchError
from runtime.policy.retry import RetryPolicy
from runtime.queue import scripts
from runtime.queue.dispatching import item_digest
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS
from runtime.wire.contract import ChatCall, Envelope, Reply, StreamOptions, Timing

CALL = ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
NOW = 1_700_000_000.0
THREE = RetryPolicy(max_attempts=3, backoff_base_s=1.0, backoff_cap_s=4.0)


def envelope(request_id: str = "r-1", **fields) -> Envelope:
    return Envelope(request_id, "prod", "pool", CALL, enqueued_at=NOW - 1, **fields)


@pytest.mark.parametrize(
    ("fields", "error", "policy", "kind"),
    [
        ({}, BackendHTTPError("x", status_code=503), THREE, scripts.SETTLE_RETRY),
        ({"attempt": 2}, BackendConnectError(), THREE, scripts.SETTLE_RETRY),
        ({"attempt": 3}, BackendTimeout(), THREE, scripts.SETTLE_DEAD),  # attempts exhausted
        ({}, BackendHTTPError("x", status_code=400), THREE, None),  # answered, not retried
        ({}, BackendHTTPError("x", status_code=503), RetryPolicy(), None),  # a pool that does not retry
        ({"deadline": NOW + 0.01}, BackendHTTPError("x", status_code=503, retry_after_s=5), THREE, None),
        ({"stream": StreamOptions()}, BackendConnectError(), THREE, None),  # chunks may be out already
    ],
)
def test_settle_failure(fields: dict, error: DispatchError, policy: RetryPolicy, kind: str | None) -> None:
    settled = redelivery.settle_failure(
        envelope(**fields), error, policy, now=NOW, timing=Timing(), rng=random.Random(1)
    )
    assert (settled.kind if settled else None) == kind


def test_a_retry_carries_the_next_attempt_and_its_due_time() -> None:
    settled = redelivery.settle_failure(
        envelope(), BackendHTTPError("x", status_code=429, retry_after_s=2.5), THREE, now=NOW, timing=Timing()
    )
    assert settled is not None and settled.reply == b""
    assert Envelope.decode(settled.payload).attempt == 2
    assert settled.due_at == pytest.approx(NOW + 2.5)  # Retry-After beats the 1 s backoff ceiling


def test_a_dead_letter_names_reason_and_last_error_and_answers_dead_lettered() -> None:
    settled = redelivery.settle_failure(
        envelope(attempt=3),
        BackendHTTPError("HTTP 503: busy", status_code=503),
        THREE,
        now=NOW,
        timing=Timing(),
    )
    assert settled is not None
    letter = DeadLetter.decode(settled.payload)
    assert (letter.reason, letter.error_type, letter.attempts) == (
        "attempts_exhausted",
        "backend_http_error",
        3,
    )
    reply = Reply.decode(settled.reply)
    assert reply.error_type == "dead_lettered" and "HTTP 503: busy" in (reply.error_message or "")


def test_requeued_envelope_counts_an_attempt_and_a_requeue() -> None:
    again = redelivery.requeued(envelope(attempt=2, requeues=1))
    assert (again.attempt, again.requeues) == (3, 2)
    assert redelivery.requeues_exhausted(again, max_requeues=2) is False
    assert redelivery.requeues_exhausted(redelivery.requeued(again), max_requeues=2) is True


async def test_promote_moves_due_retries_to_the_head_earliest_first_and_wakes_one(aredis, keys) -> None:
    delayed, queue, wake = keys.delayed("pool"), keys.requests("pool"), keys.wake_list("pool")
    await aredis.rpush(queue, b"waiting")
    now = time.time()
    await aredis.zadd(delayed, {b"due-second": now - 1, b"due-first": now - 2, b"later": now + 60})
    promote = aredis.register_script(scripts.PROMOTE)
    moved = await promote(
        keys=[delayed, queue, wake], args=[scripts.PROMOTE_BATCH, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS]
    )
    assert moved == 2
    assert await aredis.lrange(queue, 0, -1) == [b"due-first", b"due-second", b"waiting"]
    assert await aredis.zrange(delayed, 0, -1) == [b"later"]
    assert await aredis.llen(wake) == 1
    assert await promote(keys=[delayed, queue, wake], args=[10, WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS]) == 0


async def test_bury_takes_exactly_the_peeked_head_and_answers_a_live_producer(aredis, keys) -> None:
    queue, dead = keys.requests("pool"), keys.dead_letters("pool")
    alive, replies = keys.producer_alive("prod"), keys.replies("prod")
    head = envelope(requeues=4).encode()
    await aredis.rpush(queue, head, b"next")
    await aredis.set(alive, b"1")
    settled = redelivery.bury(
        Envelope.decode(head), reason=redelivery.REQUEUES_EXHAUSTED, error=None, now=NOW, timing=Timing()
    )
    bury = aredis.register_script(scripts.BURY)
    script_keys = [queue, dead, alive, replies]
    assert (
        await bury(keys=script_keys, args=[item_digest(b"other"), settled.payload, settled.reply, 60_000])
        == 0
    )
    assert await bury(keys=script_keys, args=[item_digest(head), settled.payload, settled.reply, 60_000]) == 1
    assert await aredis.lrange(queue, 0, -1) == [b"next"]
    [letter] = await aredis.lrange(dead, 0, -1)
    assert orjson.loads(letter)["reason"] == "requeues_exhausted"
    [reply] = await aredis.lrange(replies, 0, -1)
    assert Reply.decode(reply).error_type == "dead_lettered"
