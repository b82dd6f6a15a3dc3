"""An hour of demo-like traffic for the What-if speed figures (issue 25), shared by the benches.

Poisson arrivals at the demo's rates into the demo's pools, seeded, so every tree and every run
replays the very same ~40,000 requests; the demo group's configuration, and the proposed one
(``backfill.weight=4``). Imports only what every revision since the What-if has (``--before`` trees
import this file from the checkout, with their own ``runtime`` package).
"""

from __future__ import annotations

import random

from runtime.whatif.changes import apply_changes
from runtime.whatif.trace import Arrival
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig

GROUP = "demo"
HOUR_S = 3600.0
CHANGES = ("backfill.weight=4",)
_RATES = (("interactive", 4.0, 0.7), ("document-extract", 3.0, 0.9), ("backfill", 4.2, 0.7))


def demo_arrivals() -> list[Arrival]:
    """An hour of arrivals (seconds from 0), pool by pool: (pool, requests/s, mean execution s)."""
    rng = random.Random(1)
    arrivals = []
    for pool, rate, mean_s in _RATES:
        t = 0.0
        while t < HOUR_S:
            t += rng.expovariate(rate)
            arrivals.append(Arrival(t, pool, rng.choice((1, 2, 4)), rng.uniform(0.5, 1.5) * mean_s, 0.0))
    return arrivals


def demo_configs() -> tuple[GroupConfig, GroupConfig]:
    """The demo group's configuration in force, and the proposed one (:data:`CHANGES` applied)."""
    pools = (
        PoolConfig("interactive", quantum=4, min_concurrent=4, max_concurrent=12, max_burst_per_visit=4),
        PoolConfig("document-extract", quantum=2, max_concurrent=8, max_burst_per_visit=2),
        PoolConfig("backfill", quantum=1, max_concurrent=8, max_queued=200),
        PoolConfig("default"),
    )
    backend = BackendConfig("sim", "http://127.0.0.1:8100/v1", max_in_flight=64)
    current = GroupConfig(GROUP, total_concurrency=16, pools=pools, backend_id="sim", backends=(backend,))
    return current, apply_changes(current, list(CHANGES))
