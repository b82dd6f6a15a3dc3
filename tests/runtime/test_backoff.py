"""The runtime's one backoff: bounds, doubling up to the cap, reset, jitter."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.sentinel import MasterNotFoundError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runtime.backoff import FAILOVER_PAUSE_S, Backoff
from runtime.valkey.client import failing_over


@pytest.mark.parametrize(
    ("initial", "maximum", "ceilings"),
    [
        (0.1, 5.0, [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]),
        (1.0, 1.0, [1.0, 1.0, 1.0]),
        (0.5, 1.5, [0.5, 1.0, 1.5, 1.5]),
    ],
)
def test_delays_stay_between_half_and_all_of_a_doubling_ceiling(initial, maximum, ceilings) -> None:
    backoff = Backoff(initial, maximum, rng=random.Random(7))
    for ceiling in ceilings:
        assert ceiling / 2 <= backoff.next() <= ceiling


def test_reset_starts_again_from_the_initial_delay() -> None:
    backoff = Backoff(0.1, 5.0)
    for _ in range(10):
        backoff.next()
    backoff.reset()
    assert 0.05 <= backoff.next() <= 0.1


def test_jitter_spreads_processes_that_failed_together() -> None:
    delays = {Backoff(1.0, 8.0, rng=random.Random(seed)).next() for seed in range(20)}
    assert len(delays) == 20 and min(delays) >= 0.5 and max(delays) <= 1.0


@pytest.mark.parametrize(("initial", "maximum"), [(0, 1), (-1, 1), (2, 1)])
def test_invalid_bounds_are_refused(initial, maximum) -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(initial, maximum)


@given(st.floats(0.001, 10), st.floats(1, 100), st.integers(1, 60))
def test_never_above_the_cap_nor_below_half_the_first_delay(initial, factor, attempts) -> None:
    backoff = Backoff(initial, initial * factor)
    for _ in range(attempts):
        assert initial / 2 <= backoff.next() <= initial * factor


def test_a_failover_is_retried_at_a_short_fixed_pause_for_the_window_then_backs_off() -> None:
    backoff = Backoff(0.1, 5.0, rng=random.Random(3), failover_window_s=2.0)
    for _ in range(5):
        backoff.next()  # an outage already under way: the ceiling is 3.2 s
    pauses = []
    while (pause := backoff.next(failing_over=True)) <= FAILOVER_PAUSE_S:
        pauses.append(pause)
    assert all(FAILOVER_PAUSE_S / 2 <= p <= FAILOVER_PAUSE_S for p in pauses)
    assert 2.0 <= sum(pauses) < 2.0 + FAILOVER_PAUSE_S  # bounded by the window, then the capped backoff
    assert 1.6 <= pause <= 3.2
    backoff.reset()
    assert backoff.next(failing_over=True) <= FAILOVER_PAUSE_S  # a new failover gets a new window


@pytest.mark.parametrize(
    ("error", "failing"),
    [
        (MasterNotFoundError("No master found for 'dispatchmaster'"), True),
        (RedisConnectionError("Valkey at 127.0.0.1:7000 is now a replica: READONLY"), True),
        (ReadOnlyError("You can't write against a read only replica."), True),
        (RedisConnectionError("Error 111 connecting to 127.0.0.1:7000. Connection refused."), True),
        (ConnectionRefusedError(111, "Connect call failed"), True),
        (RedisConnectionError("Valkey sent nothing for 2.1s with answers owed"), False),
        (RedisTimeoutError("Timeout reading from 127.0.0.1:7000"), False),
        (RedisConnectionError("Connection to Valkey lost: closed"), False),
    ],
)
def test_what_counts_as_a_failover_in_progress(error: BaseException, failing: bool) -> None:
    assert failing_over(error) is failing


def test_a_refused_connect_is_a_failover_through_its_cause() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 7000)")
        except OSError as exc:
            raise RedisConnectionError("could not connect to Valkey") from exc
    except RedisConnectionError as wrapped:
        assert failing_over(wrapped)
