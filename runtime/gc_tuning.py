"""Garbage collection in a long-running dispatcher process.

Reference counting frees nearly everything a dispatcher allocates; CPython's cyclic collector is only
there for cycles (an exception's traceback, a cancelled task). By default it runs a young collection
every 700 net container allocations and an older one every tenth of those, and an older collection
scans every object the process holds. With 2,000 long calls in flight, each holding its objects for
a second, allocations outrun frees for the whole call: bench/bench_longcalls.py measured about 1,350
collections in 3 runs of 8,000 calls, a fifth of the dispatcher's CPU, with single pauses up to
130 ms that every call in flight waited through (bench/RESULTS.md, issue 23).

So, once the process has started: collect the set-up's garbage, freeze what is left (modules,
settings, the app registry: alive for the process's life, never scanned again), and run a young
collection every :data:`YOUNG_THRESHOLD` allocations. Cycles are still collected; they just wait
longer.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_for_service"]

YOUNG_THRESHOLD = 50_000  # net container allocations between young collections (CPython's default: 700)


def tune_for_service() -> str:
    """Freezes the objects alive now and raises the young generation's threshold; what it set, for
    the process's start line."""
    gc.collect()  # the set-up's own garbage first: frozen, a cycle would never be freed
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    return f"gc thresholds {'/'.join(map(str, gc.get_threshold()))}, {gc.get_freeze_count()} objects frozen"
