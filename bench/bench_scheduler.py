"""Scheduler decision cost as the number of backlogged pools grows.

Run: ``python bench/bench_scheduler.py``. Times :func:`runtime.policy.scheduler.decide` alone (observations
are prebuilt and static: every pool stays backlogged with the same peeked heads, nothing is in flight,
caps do not bind), and reports nanoseconds per launch decision -- the median over several runs of
(total time of a batch of calls) / (launches they made) -- for 1, 10, 100 and 1,000 pools.

Scenarios:

* ``mixed/1``: costs 1..8, weights 1..4, burst 1, one free local slot per call (a dispatcher
  launching as single slots free up).
* ``mixed/8``: the same with eight free slots per call.
* ``fifo/8``: FIFO over the same pools, eight free slots per call.
* ``huge/1``: every head costs 64 at weight 1: the no-spin jump's worst case.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.policy.scheduler import (
    GroupPolicy,
    HeadItem,
    PoolObservation,
    PoolPolicy,
    SchedulerState,
    decide,
)

POOL_COUNTS = (1, 10, 100, 1000)
RUNS = 7
LAUNCHES_PER_RUN = 4000
PEEK = 4


def build(n: int, policy: str, huge: bool, seed: int = 1) -> tuple[GroupPolicy, dict[str, PoolObservation]]:
    rng = random.Random(seed)
    pools = []
    observations = {}
    clock = 0.0
    for i in range(n):
        pid = f"pool-{i:04d}"
        quantum = 1 if huge else rng.randint(1, 4)
        pools.append(PoolPolicy(pid, quantum=quantum, max_concurrent=1_000_000, max_burst_per_visit=1))
        heads = []
        for _ in range(PEEK):
            clock += rng.random()
            heads.append(HeadItem(64 if huge else rng.randint(1, 8), clock))
        observations[pid] = PoolObservation(pid, backlog=1_000, heads=tuple(heads), in_flight=0)
    return GroupPolicy(policy, 1_000_000, tuple(pools)), observations


def measure(n: int, policy: str, local: int, huge: bool) -> tuple[float, float]:
    """Median ns per launch and median launches per call over RUNS runs."""
    group, observations = build(n, policy, huge)
    per_launch, per_call = [], []
    for _ in range(RUNS):
        state = SchedulerState()
        for _ in range(200):  # warm up: spread the credit out as in steady state
            decide(group, state, observations, group_in_flight=0, local_free_slots=local)
        launches = calls = 0
        started = time.perf_counter_ns()
        while launches < LAUNCHES_PER_RUN:
            d = decide(group, state, observations, group_in_flight=0, local_free_slots=local)
            launches += len(d.launches)
            calls += 1
        elapsed = time.perf_counter_ns() - started
        per_launch.append(elapsed / launches)
        per_call.append(launches / calls)
    return statistics.median(per_launch), statistics.median(per_call)


def main() -> None:
    scenarios = [("mixed/1", "drr", 1, False), ("mixed/8", "drr", 8, False), ("fifo/8", "fifo", 8, False)]
    scenarios.append(("huge/1", "drr", 1, True))
    print(f"decide() cost per launch decision, median of {RUNS} runs x {LAUNCHES_PER_RUN} launches")
    print(f"python {sys.version.split()[0]}")
    header = (
        f"{'scenario':<10}" + "".join(f"{n:>12} pools" for n in POOL_COUNTS) + f"{'x growth 1->1000':>20}"
    )
    print(header)
    print("-" * len(header))
    for name, policy, local, huge in scenarios:
        cells, base, last = [], 0.0, 0.0
        for n in POOL_COUNTS:
            ns, per_call = measure(n, policy, local, huge)
            cells.append(f"{ns / 1000:.2f} µs ({per_call:.1f})".rjust(18))
            base = base or ns
            last = ns
        print(f"{name:<10}" + "".join(cells) + f"{last / base:>19.1f}x")
    print("(µs per launch; in parentheses the launches made per decide call)")


if __name__ == "__main__":
    main()
