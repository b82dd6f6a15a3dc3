"""The what-if replay of pools with tenant fairness: the tenant scheduler's order, inside DRR."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.policy.tenants import TenantCost, TenantLedger
from runtime.whatif.compare import what_if
from runtime.whatif.engine import Replay, replay
from runtime.whatif.trace import Arrival, Trace
from runtime.whatif.workload import Workload
from runtime.wire.groupconfig import GroupConfig, PoolConfig

FOREVER = 1e9
DEFAULT_OUTPUT = 50


def group(*pools: PoolConfig, total: int) -> GroupConfig:
    return GroupConfig("g", total_concurrency=total, pools=pools, default_endpoint_url="http://sim:1/v1")


def fair_pool(pool_id: str = "chat", mode: str = "tokens", **kw: object) -> PoolConfig:
    return PoolConfig(
        pool_id,
        tenant_fairness=mode,
        tenant_default_output_tokens=DEFAULT_OUTPUT,
        **kw,  # type: ignore[arg-type]
    )


def tenant_order(trace: Trace, pool: PoolConfig, replayed: Replay, weights: dict[str, float]) -> list[int]:
    """The pool's requests in the order the tenant scheduler alone picks them, fed the trace's
    arrivals and the charges' corrections, launching at the instants the replay launched the pool
    (and with the calls' modelled durations: when a charge is corrected depends on them).

    At each launch instant, in the replay's order of events: completions correct their tenant's
    charge, arrivals enter their tenant, then each launch takes the head of the lowest counter's tenant
    (:meth:`TenantLedger.pick`), charging the estimate (recorded prompt tokens, default output).
    """
    cost = pool.tenant_cost() or TenantCost()
    ledger = TenantLedger(weights=weights)
    mine = [i for i in range(len(trace)) if trace.pools[trace.pool[i]] == pool.pool_id]
    slots = sorted(replayed.launched_at[i] for i in mine if not math.isnan(replayed.launched_at[i]))
    queues: dict[str, deque[int]] = {}
    running: list[tuple[float, int]] = []  # (end, request), for corrections
    ended_at = replayed.ended_at
    arrivals = deque(mine)
    order: list[int] = []

    def tenant(i: int) -> str:
        return trace.tenants[trace.tenant[i]] or "*"

    def estimate(i: int) -> tuple[int, int]:
        return trace.input_tokens[i], DEFAULT_OUTPUT

    def correct(i: int) -> None:
        actual = (trace.input_tokens[i], trace.output_tokens[i])
        ledger.correct(tenant(i), cost.correction(estimate(i), actual if any(actual) else None))

    def arrive(i: int) -> None:
        queue = queues.setdefault(tenant(i), deque())
        if not queue:
            ledger.enter(tenant(i))
        queue.append(i)

    for now in slots:
        # Events in time order (a re-entering tenant's counter depends on the corrections before it);
        # at one instant completions come before arrivals, as in the replay.
        while True:
            next_end = min(running, default=(math.inf, -1))
            next_arrival = trace.enqueued_at[arrivals[0]] if arrivals else math.inf
            if min(next_end[0], next_arrival) > now:
                break
            if next_end[0] <= next_arrival:
                running.remove(next_end)
                correct(next_end[1])
            else:
                arrive(arrivals.popleft())
        picked = ledger.pick()
        assert picked is not None
        i = queues[picked].popleft()
        ledger.charge(picked, cost.of(*estimate(i)))
        if not queues[picked]:
            ledger.leave(picked)
        order.append(i)
        running.append((ended_at[i], i))
    return order


def assert_tenant_order(arrivals: list[Arrival], config: GroupConfig, weights: dict[str, float]) -> None:
    trace = Trace.build(arrivals, end=FOREVER)
    result = replay(Workload(trace, config), config, tenant_weights=weights)
    for pool in config.pools:
        if pool.tenant_cost() is None:
            continue
        in_pool = [i for i in result.launch_order if trace.pools[trace.pool[i]] == pool.pool_id]
        assert in_pool, "the pool launched nothing: the test would check nothing"
        assert in_pool == tenant_order(trace, pool, result, weights)


def traffic(seed: int, n: int, pools: list[str], tenants: list[str]) -> list[Arrival]:
    """Deterministic bursts: tenants of uneven rates, prompts of uneven sizes, usage unlike the estimate."""
    rows, x = [], seed
    for k in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        pool = pools[(x >> 8) % len(pools)]
        tenant = tenants[min((x >> 10) % (2 * len(tenants)), len(tenants) - 1)]  # the last one is noisy
        rows.append(
            Arrival(
                float(k // 4 + (x >> 4) % 2),
                pool,
                1 + (x >> 12) % 3,
                float(1 + (x >> 16) % 4),
                0.0,
                tenant=tenant,
                input_tokens=10 + (x >> 18) % 200,
                output_tokens=(x >> 20) % 120,
            )
        )
    return rows


def test_a_fair_pools_launches_follow_the_tenant_scheduler_inside_drr() -> None:
    config = group(
        fair_pool("chat", quantum=2, max_concurrent=3, max_burst_per_visit=2),
        PoolConfig("batch", quantum=1, max_concurrent=4),
        total=5,
    )
    arrivals = traffic(3, 500, ["chat", "chat", "batch"], ["key-1", "key-2", "key-3:bob", ""])
    assert_tenant_order(arrivals, config, {"key-2": 3.0})


def test_requests_mode_and_a_tenant_with_no_recorded_usage_keep_the_estimate() -> None:
    config = group(fair_pool("chat", "requests", max_concurrent=2), total=2)
    arrivals = traffic(8, 300, ["chat"], ["a", "b", "c"])
    assert_tenant_order(arrivals, config, {})
    no_usage = [dataclasses.replace(a, output_tokens=0, input_tokens=0) for a in arrivals]
    assert_tenant_order(no_usage, group(fair_pool("chat", max_concurrent=2), total=2), {})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    tenants=st.integers(1, 5),
    slots=st.integers(1, 4),
    burst=st.integers(1, 3),
    mode=st.sampled_from(["requests", "tokens"]),
    weight=st.floats(0.5, 4),
)
def test_the_tenant_order_holds_for_any_traffic(  # type: ignore[no-untyped-def]
    seed, tenants, slots, burst, mode, weight
) -> None:
    config = group(
        fair_pool("chat", mode, max_concurrent=slots, max_burst_per_visit=burst, quantum=2),
        PoolConfig("other", max_concurrent=2),
        total=slots + 1,
    )
    names = [f"t{k}" for k in range(tenants)]
    assert_tenant_order(traffic(seed, 80, ["chat", "other"], names), config, {"t0": weight})


def test_fairness_on_shortens_a_quiet_tenants_wait_behind_a_noisy_one() -> None:
    # One slot serving a call a second: the noisy tenant submits 5 a second, the quiet one one every
    # 4 s, under its half share.
    rows = [Arrival(t * 0.2, "chat", 1, 1.0, 0.0, tenant="noisy") for t in range(300)]
    rows += [Arrival(t * 4.0 + 0.1, "chat", 1, 1.0, 0.0, tenant="quiet") for t in range(15)]
    off = group(PoolConfig("chat", max_concurrent=1), total=1)
    on = group(fair_pool("chat", "requests", max_concurrent=1), total=1)
    result = what_if(Trace.build(rows, end=FOREVER), off, on)
    trace = result.trace
    quiet = [i for i in range(len(trace)) if trace.tenants[trace.tenant[i]] == "quiet"]

    def worst_quiet_wait(launched_at: object) -> float:
        return max(launched_at[i] - trace.enqueued_at[i] for i in quiet)  # type: ignore[index]

    assert worst_quiet_wait(result.proposed.launched_at) < 2.5  # served about as it arrives
    assert worst_quiet_wait(result.current.launched_at) > 30  # behind the noisy tenant's backlog


def test_max_queued_per_tenant_refuses_only_the_tenant_at_its_cap() -> None:
    config = group(fair_pool("chat", "requests", max_concurrent=1, max_queued_per_tenant=3), total=1)
    rows = [Arrival(0.0, "chat", 1, 10.0, 0.0, tenant="noisy") for _ in range(10)]
    rows += [Arrival(0.0, "chat", 1, 10.0, 0.0, tenant="quiet") for _ in range(2)]
    result = replay(Workload(Trace.build(rows, start=0, end=100), config), config).pool("chat")
    assert (result.refused, result.launched) == (7, 5)
