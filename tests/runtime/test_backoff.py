"""The runtime's one backoff: bounds, doubling up to the cap, reset, jitter."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.backoff import Backoff


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
