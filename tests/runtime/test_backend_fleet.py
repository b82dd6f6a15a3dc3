"""BackendFleet's breaker questions against a real Valkey: the synchronous answer (acquire_now)
never contradicts the awaited one, for bare URLs (local breakers) and backend rows (shared); and
when a round may decide from the reading the last pipeline brought instead of reading its own."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from runtime.backends.fleet import BackendFleet
from runtime.backends.gate import RETRY_AFTER_HOLD_MAX_S, SKIP_BACKEND_RETRY_AFTER
from runtime.backends.health import EndpointBreakers
from runtime.errors import BackendConnectError, BackendHTTPError
from runtime.queue.dispatching import QueueOps, TurnEnd
from runtime.queue.keys import KeySpace
from runtime.valkey.lua import Commands
from runtime.wire.backendconfig import BackendConfig, BreakerPolicy
from tests.support.waiting import wait_until_equal

POLICY = BreakerPolicy(failure_threshold=2, open_s=5.0, half_open_probes=1)
URL = "http://bare:1/v1"
GPU = BackendConfig("gpu", "http://gpu:8000/v1", breaker_failures=2, breaker_open_s=5.0, breaker_probes=1)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def fleet(client: aioredis.Redis, keys: KeySpace, clock: Clock) -> BackendFleet:
    result = BackendFleet(
        client, keys, owner_id="d1", local=EndpointBreakers(POLICY, clock=clock), clock=clock
    )
    result.configure((GPU,))
    return result


async def test_a_bare_url_is_answered_without_a_round_trip(aredis: aioredis.Redis, keys: KeySpace) -> None:
    clock = Clock()
    backends = fleet(aredis, keys, clock)
    assert backends.acquire_now("", URL) is True
    for _ in range(2):
        await backends.record("", URL, BackendConnectError("refused"))
    assert backends.acquire_now("", URL) is False  # open
    clock.now += POLICY.open_s
    assert backends.acquire_now("", URL) is True  # the probe slot, taken
    assert backends.acquire_now("", URL) is False
    backends.local.release(URL)
    assert await backends.acquire("", URL) is True  # the awaited path agrees


async def test_a_backend_row_is_answered_now_only_while_closed(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    clock = Clock()
    backends = fleet(aredis, keys, clock)
    await backends.refresh()
    assert backends.acquire_now("gpu", GPU.base_url) is True
    assert backends.acquire_now("unknown", "http://x/v1") is True  # no breaker configured: acquire says True
    assert await backends.acquire("unknown", "http://x/v1") is True
    for _ in range(2):
        await backends.record("gpu", GPU.base_url, BackendConnectError("refused"))
    await backends.refresh()
    assert backends.acquire_now("gpu", GPU.base_url) is None  # open: only the shared state can answer
    assert await backends.acquire("gpu", GPU.base_url) is False
    clock.now += GPU.breaker_open_s
    assert backends.acquire_now("gpu", GPU.base_url) is None
    assert await backends.acquire("gpu", GPU.base_url) is True  # the fleet's one probe
    assert await backends.acquire("gpu", GPU.base_url) is False


# --- issue 24: a 429's Retry-After holds the backend for the whole fleet ------------------------------
OLLAMA = BackendConfig("ollama", "http://ollama:11434/v1", kind="openai", load_gating=False, max_in_flight=4)


async def test_a_429_with_retry_after_holds_the_backend_for_every_dispatcher(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    first, second = (fleet(aredis, keys, Clock()) for _ in range(2))
    for backends in (first, second):
        backends.configure((GPU, OLLAMA))
        await backends.refresh()
        assert backends.refusal("ollama", OLLAMA.base_url) is None
    await first.record(
        "ollama", OLLAMA.base_url, BackendHTTPError("slow down", status_code=429, retry_after_s=1.0)
    )
    await second.refresh()  # another dispatcher: it only reads Valkey
    status = second.statuses["ollama"]
    assert second.refusal("ollama", OLLAMA.base_url) == SKIP_BACKEND_RETRY_AFTER
    assert (second.limit("ollama"), second.room("ollama", OLLAMA.base_url)) == (0, 0)
    assert 0 < status.hold_s <= 1.0
    assert "held: backend_retry_after (the backend answered 429 with Retry-After;" in status.describe()
    assert second.refusal("gpu", GPU.base_url) is None  # only that backend
    # Over when Valkey expires the key: no dispatcher's clock decides.
    await wait_until_equal(lambda: aredis.exists(keys.backend_hold("ollama")), 0, what="hold expired")
    await second.refresh()
    assert second.refusal("ollama", OLLAMA.base_url) is None and second.limit("ollama") == 4


@pytest.mark.parametrize(
    "error",
    [
        BackendHTTPError("no hint", status_code=429),  # no Retry-After: the retry backoff alone
        BackendHTTPError("now", status_code=429, retry_after_s=0.0),
        BackendHTTPError("down", status_code=503, retry_after_s=5.0),  # a 503 trips the breaker instead
        BackendConnectError("refused"),
        None,
    ],
)
async def test_only_a_429_with_a_retry_after_holds(
    aredis: aioredis.Redis, keys: KeySpace, error: BackendHTTPError | BackendConnectError | None
) -> None:
    backends = fleet(aredis, keys, Clock())
    backends.configure((OLLAMA,))
    await backends.record("ollama", OLLAMA.base_url, error)
    assert await aredis.exists(keys.backend_hold("ollama")) == 0


async def test_a_huge_retry_after_holds_at_most_the_cap(aredis: aioredis.Redis, keys: KeySpace) -> None:
    backends = fleet(aredis, keys, Clock())
    backends.configure((OLLAMA,))
    await backends.record(
        "ollama", OLLAMA.base_url, BackendHTTPError("x", status_code=429, retry_after_s=1e12)
    )
    assert 0 < await aredis.pttl(keys.backend_hold("ollama")) <= RETRY_AFTER_HOLD_MAX_S * 1000


# --- issue 23: the reading rides in a round's pipelines; a round reads afresh only when it must --------
def ollama_fleet(client: aioredis.Redis, keys: KeySpace) -> tuple[Clock, BackendFleet]:
    clock = Clock()
    backends = fleet(client, keys, clock)
    backends.configure((OLLAMA,))
    return clock, backends


async def held_elsewhere(client: aioredis.Redis, keys: KeySpace) -> None:
    """The ollama backend held as another dispatcher's 429 holds it."""
    await client.set(keys.backend_hold("ollama"), "30", px=30_000)


async def before_a_round(backends: BackendFleet) -> tuple[int, str | None]:
    """What a round does first (read unless the reading is fresh): the readings taken in a round trip
    of their own so far, and the ollama backend's refusal as the round then sees it."""
    await backends.refresh_unless_fresh()
    return backends.refreshes, backends.refusal("ollama", OLLAMA.base_url)


async def test_a_reading_that_refuses_nothing_decides_rounds_until_it_is_too_old(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    clock, backends = ollama_fleet(aredis, keys)
    assert await before_a_round(backends) == (1, None)  # never read: read now
    await held_elsewhere(aredis, keys)
    clock.now += backends.status_max_age_s
    assert await before_a_round(backends) == (1, None)  # still young enough: the hold is not seen yet
    clock.now += 0.001
    assert await before_a_round(backends) == (2, SKIP_BACKEND_RETRY_AFTER)


async def test_a_reading_that_refuses_is_read_afresh_by_every_round(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    """Only "room" is taken on trust: a refusal that has ended meanwhile must not hold work back."""
    _, backends = ollama_fleet(aredis, keys)
    await held_elsewhere(aredis, keys)
    for refreshes in (1, 2, 3):  # the clock stands still: the reading is never old
        assert await before_a_round(backends) == (refreshes, SKIP_BACKEND_RETRY_AFTER)
    await aredis.delete(keys.backend_hold("ollama"))
    assert await before_a_round(backends) == (4, None)
    assert await before_a_round(backends) == (4, None)


async def test_a_failed_call_of_its_own_has_the_next_round_read_afresh(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    clock, backends = ollama_fleet(aredis, keys)
    await backends.refresh()
    await backends.record("ollama", OLLAMA.base_url, None)  # a success changes no refusal
    refused = BackendHTTPError("bad request", status_code=400)  # nor does the caller's own mistake
    await backends.record("ollama", OLLAMA.base_url, refused)
    assert (await before_a_round(backends))[0] == 1
    # A reading sent before the failure was recorded, answered after it (a pipeline running beside
    # the call's): it may not show the failure's hold, so it decides no round.
    before = Commands()
    take = backends.queue_reads(before)
    assert take is not None
    limited = BackendHTTPError("slow down", status_code=429, retry_after_s=30.0)
    clock.now += 0.001
    await backends.record("ollama", OLLAMA.base_url, limited)
    take([None, None, 0, -2])  # its replies: no load, no breaker state, nothing in flight, no hold
    assert backends.refusal("ollama", OLLAMA.base_url) is None
    # As young as before, but its own call just failed:
    assert await before_a_round(backends) == (2, SKIP_BACKEND_RETRY_AFTER)


async def test_a_reading_answered_after_a_later_one_is_dropped(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    clock, backends = ollama_fleet(aredis, keys)
    older = backends.queue_reads(Commands())
    clock.now += 0.001
    await held_elsewhere(aredis, keys)
    await backends.refresh()  # the later reading, answered first: held
    assert older is not None
    older([None, None, 0, -2])
    assert backends.read_at == clock.now
    assert backends.refusal("ollama", OLLAMA.base_url) == SKIP_BACKEND_RETRY_AFTER


async def test_the_reading_rides_at_the_end_of_a_rounds_pipeline(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    clock = Clock()
    backends = fleet(aredis, keys, clock)
    backends.configure((GPU, OLLAMA))
    queue = QueueOps(aredis, keys, "g")
    queue.riding = backends
    await held_elsewhere(aredis, keys)
    end = TurnEnd(holder="d1", left_work=False, wake_pool="default")
    assert await queue.claim([], 30.0, end_turn=end) == []  # its own answers: the reads' are taken off
    assert queue.trips == 1 and backends.refreshes == 0 and backends.read_at == clock.now
    assert backends.refusal("ollama", OLLAMA.base_url) == SKIP_BACKEND_RETRY_AFTER
    assert backends.refusal("gpu", GPU.base_url) is None and backends.limit("gpu") == GPU.max_in_flight
