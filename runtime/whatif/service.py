"""How long a replayed call runs: its recorded execution time, scaled for the concurrency it meets.

With vLLM-like backends more calls in flight means slower calls (they share the GPU's batch; past its
running slots they wait inside the engine). History records, for every call, its execution time;
the calls' own start and end times give how many calls of the group were in flight on that backend
when each one started. A straight line fitted per backend,

    execution_s ~= a + b * in_flight          (least squares over the window's calls; b >= 0)

is the whole model. A replayed call that recorded ``e`` seconds at ``k`` in flight and now starts at
``k'`` in flight runs ``e * f(k') / f(k)`` seconds, ``f(k) = max(a + b*k, floor)``. Under the
configuration in force ``k' ~= k`` and the recorded time is kept; a change that raises concurrency
stretches calls by the fitted slope. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from runtime.immutable import immutable

__all__ = ["ServiceFit", "Turnaround", "fit", "in_flight_at_start", "turnaround"]

MIN_POINTS = 20  # fewer calls than this: no slope is fitted (times are kept as recorded)
MAX_TURNAROUND_S = 1.0  # a longer gap is the group idling, not the dispatcher reacting
# f(k) never drops below this share of the mean time: a negative intercept would make calls free.
FLOOR_SHARE = 0.05


@immutable
class ServiceFit:
    """``execution_s ~= intercept + slope * in_flight`` for one backend, and how well it fits."""

    backend: str
    intercept: float
    slope: float
    r2: float | None
    points: int
    mean_in_flight: float
    mean_s: float

    @property
    def floor(self) -> float:
        return max(1e-6, FLOOR_SHARE * self.mean_s)

    def time_at(self, in_flight: float) -> float:
        """Modelled mean execution time with ``in_flight`` calls running (itself included)."""
        return max(self.intercept + self.slope * in_flight, self.floor)

    def scale(self, recorded_in_flight: int, in_flight: int) -> float:
        """Factor for a call recorded at one concurrency and replayed at another."""
        if self.slope == 0.0 or recorded_in_flight == in_flight:
            return 1.0
        return self.time_at(in_flight) / self.time_at(recorded_in_flight)

    def describe(self) -> str:
        r2 = "n/a" if self.r2 is None else f"{self.r2:.2f}"
        return (
            f"{self.backend or 'default'}: exec ~= {self.intercept:.3f} s "
            f"+ {self.slope * 1000:.1f} ms x in-flight "
            f"(R² {r2}, {self.points} calls, mean {self.mean_in_flight:.1f} in flight)"
        )


def fit(backend: str, in_flight: Sequence[int], execution_s: Sequence[float]) -> ServiceFit:
    """Least-squares line of execution time against in-flight; a flat line when the data cannot
    carry a slope (too few calls, one concurrency only) or the slope comes out negative."""
    n = len(execution_s)
    mean_s = sum(execution_s) / n if n else 0.0
    mean_k = sum(in_flight) / n if n else 0.0
    sxx = sum((k - mean_k) ** 2 for k in in_flight)
    if n < MIN_POINTS or sxx <= 0.0:
        return ServiceFit(backend, mean_s, 0.0, None, n, mean_k, mean_s)
    sxy = sum((k - mean_k) * (e - mean_s) for k, e in zip(in_flight, execution_s, strict=True))
    syy = sum((e - mean_s) ** 2 for e in execution_s)
    slope = max(0.0, sxy / sxx)
    intercept = mean_s - slope * mean_k
    if syy <= 0.0:
        r2: float | None = None
    else:
        resid = sum((e - intercept - slope * k) ** 2 for k, e in zip(in_flight, execution_s, strict=True))
        r2 = 1.0 - resid / syy
    return ServiceFit(backend, intercept, slope, r2, n, mean_k, mean_s)


def in_flight_at_start(starts: Sequence[float], ends: Sequence[float]) -> list[int]:
    """For each call (start, end) of one backend, the calls running once every call starting at that
    same instant has started (itself included). ``starts`` must be sorted. A call ending exactly
    when another starts no longer counts. The replay counts a launch's in-flight the same way."""
    running: list[float] = []  # end times of the calls started so far, as a heap
    counts: list[int] = []
    i, n = 0, len(starts)
    while i < n:
        start = starts[i]
        while running and running[0] <= start:
            heapq.heappop(running)
        j = i
        while j < n and starts[j] == start:
            heapq.heappush(running, ends[j])
            j += 1
        counts.extend([len(running)] * (j - i))
        i = j
    return counts


@immutable
class Turnaround:
    """How long a freed slot stays idle before the dispatcher fills it again: the FINISH, the wake
    and the next round. ``gaps`` are the measured ones in recorded order (the replay's rounds take them
    in turn, so a loaded dispatcher's slow rounds come back as often as they came); ``seconds`` is
    their median, shown to the operator."""

    seconds: float
    points: int
    gaps: tuple[float, ...] = ()

    def describe(self) -> str:
        if not self.points:
            return "dispatcher turnaround: not measured (the group never filled), 0 ms"
        ordered = sorted(self.gaps)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        return (
            f"dispatcher turnaround: {self.seconds * 1000:.1f} ms median, {p90 * 1000:.1f} ms p90, from a "
            f"call's end to the next launch into its slot ({self.points} launches into a full group)"
        )


def turnaround(
    calls: Sequence[tuple[float, float, float]], total_concurrency: int, *, min_points: int = MIN_POINTS
) -> Turnaround:
    """Turnaround measured on recorded ``calls`` (enqueued, launched, ended), sorted by launch.

    A launch counts when it filled the group's last free slot and its request was already queued
    when the latest call before it ended: it waited for that slot, so the gap between that end and the
    launch is the dispatcher's reaction, not the traffic's. Fewer than ``min_points``: 0 (not measured).
    """
    ends = sorted(end for _, _, end in calls)
    running: list[float] = []
    gaps: list[float] = []
    j = 0  # ends[:j] are the ends at or before the current launch
    for enqueued, launched, end in calls:
        while running and running[0] <= launched:
            heapq.heappop(running)
        while j < len(ends) and ends[j] <= launched:
            j += 1
        if j and len(running) == total_concurrency - 1 and enqueued < ends[j - 1]:
            gap = launched - ends[j - 1]
            if gap <= MAX_TURNAROUND_S:
                gaps.append(gap)
        heapq.heappush(running, end)
    if len(gaps) < min_points:
        return Turnaround(0.0, 0)
    return Turnaround(sorted(gaps)[len(gaps) // 2], len(gaps), tuple(gaps))
