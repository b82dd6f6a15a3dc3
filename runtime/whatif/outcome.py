"""What a replay predicts: per pool, and for the whole run (:func:`summarize` builds it).

Pure; the counts come from :mod:`runtime.whatif.engine`, the waits from the launch times it recorded.
"""

from __future__ import annotations

import math
from array import array

from runtime.immutable import immutable
from runtime.whatif.trace import Trace, percentile

__all__ = ["DEPTH_BUCKETS", "LEVELS", "PoolOutcome", "PoolTally", "Replay", "summarize"]

DEPTH_BUCKETS = 120  # points of each pool's queue-depth chart
LEVELS = (0.5, 0.95, 0.99)


@immutable
class PoolOutcome:
    """What the replay predicts for one pool over the window."""

    pool_id: str
    arrivals: int
    launched: int
    refused: int  # refused at admission (or the pool is not in this configuration)
    unserved: int  # admitted but still queued when the window ends (e.g. paused, or a growing queue)
    wait: dict[float, float | None]  # level -> queue wait in seconds, of launched requests
    throughput_per_s: float  # calls completed inside the window, per second
    peak_depth: int
    depth: tuple[int, ...]  # the largest queue depth in each of DEPTH_BUCKETS slices of the window


@immutable
class Replay:
    pools: tuple[PoolOutcome, ...]
    launch_order: array[int]  # request indices in the order they were launched
    launched_at: array[float]  # per request: virtual launch time, NaN when never launched
    ended_at: array[float]  # per request: when its modelled call ends, NaN when never launched
    peak_in_flight: int
    peak_pool_in_flight: dict[str, int]
    peak_backend_in_flight: dict[str, int]
    decisions: int  # scheduler calls made

    def pool(self, pool_id: str) -> PoolOutcome:
        return next(p for p in self.pools if p.pool_id == pool_id)


@immutable
class PoolTally:
    """One replayed pool's counts at the window's end."""

    refused: int
    unserved: int
    done: int  # calls completed inside the window
    peak_depth: int
    depth: list[int]
    peak_in_flight: int


def summarize(
    trace: Trace,
    tallies: dict[str, PoolTally],
    unknown: dict[str, int],
    *,
    launch_order: array[int],
    launched_at: array[float],
    ended_at: array[float],
    peak_in_flight: int,
    peak_backend_in_flight: dict[str, int],
    decisions: int,
) -> Replay:
    """The replay's result: ``tallies`` of the configuration's pools, ``unknown`` pools' refusals."""
    waits: dict[str, list[float]] = {pid: [] for pid in tallies}
    arrivals = dict.fromkeys(trace.pools, 0)
    names, enqueued = trace.pools, trace.enqueued_at
    for i, p in enumerate(trace.pool):
        pid = names[p]
        arrivals[pid] += 1
        at = launched_at[i]
        if not math.isnan(at):
            waits[pid].append(at - enqueued[i])
    span = max(trace.end - trace.start, 1e-9)
    outcomes = []
    for pid, tally in tallies.items():
        values = sorted(waits[pid])
        outcomes.append(
            PoolOutcome(
                pool_id=pid,
                arrivals=arrivals.get(pid, 0),
                launched=len(values),
                refused=tally.refused,
                unserved=tally.unserved,
                wait={level: percentile(values, level) for level in LEVELS},
                throughput_per_s=tally.done / span,
                peak_depth=tally.peak_depth,
                depth=tuple(tally.depth),
            )
        )
    for pid, refused in unknown.items():
        outcomes.append(PoolOutcome(pid, arrivals[pid], 0, refused, 0, dict.fromkeys(LEVELS), 0.0, 0, ()))
    return Replay(
        pools=tuple(outcomes),
        launch_order=launch_order,
        launched_at=launched_at,
        ended_at=ended_at,
        peak_in_flight=peak_in_flight,
        peak_pool_in_flight={pid: t.peak_in_flight for pid, t in tallies.items()},
        peak_backend_in_flight=peak_backend_in_flight,
        decisions=decisions,
    )
