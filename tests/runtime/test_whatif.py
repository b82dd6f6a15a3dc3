"""The what-if replay: exact against a plain scheduler loop, hypothesis invariants, tables."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.policy.scheduler import HeadItem, PoolObservation, SchedulerState, decide
from runtime.whatif.changes import BadChange, apply_changes
from runtime.whatif.compare import format_table, what_if
from runtime.whatif.engine import PEEK_DEPTH, replay
from runtime.whatif.service import Turnaround, fit, in_flight_at_start, turnaround
from runtime.whatif.trace import Arrival, Trace
from runtime.whatif.workload import Workload
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig

FOREVER = 1e9  # a window end long after the last arrival: every request gets its chance


def config(*pools: PoolConfig, total: int = 8, policy: str = "drr", cap: int | None = None) -> GroupConfig:
    backends = (BackendConfig("sim", "http://sim:1/v1", max_in_flight=cap),) if cap else ()
    return GroupConfig(
        "g",
        policy=policy,
        total_concurrency=total,
        pools=pools,
        backends=backends,
        backend_id="sim" if cap else "",
        default_endpoint_url="http://sim:1/v1",
    )


def reference_run(arrivals: list[Arrival], group: GroupConfig) -> list[tuple[int, int]]:
    """The real scheduler driven by the plainest loop: integer ticks, every pool's heads read each
    round, rounds until one launches nothing. Returns (request index in enqueue order, launch tick)
    in launch order."""
    policy = group.scheduler_policy()
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i].enqueued_at)
    queues: dict[str, deque[int]] = {p.pool_id: deque() for p in policy.pools}
    in_flight = dict.fromkeys(queues, 0)
    running: list[tuple[float, str]] = []
    state, launched, nxt, tick = SchedulerState(), [], 0, 0
    while nxt < len(order) or running or any(queues.values()):
        for end, pid in [r for r in running if r[0] <= tick]:
            running.remove((end, pid))
            in_flight[pid] -= 1
        while nxt < len(order) and arrivals[order[nxt]].enqueued_at <= tick:
            queues[arrivals[order[nxt]].pool_id].append(nxt)
            nxt += 1
        while sum(in_flight.values()) < policy.total_concurrency:
            observations = {
                pid: PoolObservation(
                    pid,
                    len(q),
                    tuple(
                        HeadItem(arrivals[order[i]].cost, arrivals[order[i]].enqueued_at)
                        for i in list(q)[:PEEK_DEPTH]
                    ),
                    in_flight[pid],
                )
                for pid, q in queues.items()
            }
            gif = sum(in_flight.values())
            d = decide(
                policy,
                state,
                observations,
                group_in_flight=gif,
                local_free_slots=policy.total_concurrency - gif,
            )
            if not d.launches:
                break
            for launch in d.launches:
                i = queues[launch.pool_id].popleft()
                launched.append((i, tick))
                in_flight[launch.pool_id] += 1
                running.append((tick + (arrivals[order[i]].execution_s or 0), launch.pool_id))
        tick += 1
    return launched


def arrivals_of(rows: list[tuple[int, str, int, int]]) -> list[Arrival]:
    return [Arrival(float(t), pool, cost, float(ex), 0.0) for t, pool, cost, ex in rows]


def synthetic(seed: int, n: int, pools: list[str]) -> list[tuple[int, str, int, int]]:
    """A deterministic trace with integer times: bursts on some pools, long calls on others."""
    rows, x = [], seed
    for k in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        pool = pools[(x >> 8) % len(pools)]
        rows.append((k // 3 + (x >> 4) % 2, pool, 1 + (x >> 12) % 4, 1 + (x >> 16) % 5))
    return rows


def assert_replay_reproduces(arrivals: list[Arrival], group: GroupConfig) -> None:
    run = reference_run(arrivals, group)
    # History of that run: each request's queue wait is what the scheduler made it, so the service
    # model sees the concurrency each call really met, and the replay must meet the same.
    ordered = sorted(arrivals, key=lambda a: a.enqueued_at)
    launched_at = dict(run)
    recorded = [
        dataclasses.replace(a, queue_wait_s=launched_at[i] - a.enqueued_at) for i, a in enumerate(ordered)
    ]
    result = replay(Workload(Trace.build(recorded, end=FOREVER), group), group)
    assert len(result.launch_order) == len(arrivals)
    assert list(result.launch_order) == [i for i, _ in run]
    assert [result.launched_at[i] for i, _ in run] == [float(tick) for _, tick in run]


def test_replay_of_the_current_configuration_launches_in_the_real_schedulers_order() -> None:
    group = config(
        PoolConfig("interactive", quantum=4, max_concurrent=4, min_concurrent=2),
        PoolConfig("docs", quantum=2, max_concurrent=3, max_burst_per_visit=2),
        PoolConfig("backfill", quantum=1, max_concurrent=8),
        total=6,
    )
    assert_replay_reproduces(
        arrivals_of(synthetic(7, 600, ["interactive", "docs", "backfill", "backfill"])), group
    )


def test_replay_reproduces_a_lightly_loaded_run_where_calls_slow_with_concurrency() -> None:
    group = config(PoolConfig("a", quantum=3, max_concurrent=3), PoolConfig("b", max_concurrent=4), total=5)
    rows = synthetic(5, 400, ["a", "b"])
    # Sparse arrivals; a call runs longer the more calls started close to it (a vLLM-like slowdown).
    rows = [
        (t * 2, pool, cost, 1 + sum(1 for u, *_ in rows if abs(u - t) <= 1) // 2) for t, pool, cost, _ in rows
    ]
    arrivals = arrivals_of(rows)
    assert_replay_reproduces(arrivals, group)


def test_fifo_replay_matches_the_real_schedulers_order() -> None:
    group = config(
        PoolConfig("a", max_concurrent=2), PoolConfig("b", max_concurrent=5), total=4, policy="fifo"
    )
    assert_replay_reproduces(arrivals_of(synthetic(3, 300, ["a", "b"])), group)


def test_a_bigger_weight_shortens_the_pools_predicted_wait() -> None:
    pools = (PoolConfig("a", quantum=1, max_concurrent=8), PoolConfig("b", quantum=1, max_concurrent=8))
    current = config(*pools, total=4)
    proposed = dataclasses.replace(current, pools=(dataclasses.replace(pools[0], quantum=4), pools[1]))
    arrivals = arrivals_of([(t // 3, "a" if t % 2 else "b", 1, 2) for t in range(400)])  # over capacity
    result = what_if(Trace.build(arrivals, end=FOREVER), current, proposed)
    assert result.proposed.pool("a").wait[0.5] < result.current.pool("a").wait[0.5]
    assert result.proposed.pool("b").wait[0.5] > result.current.pool("b").wait[0.5]
    table = format_table(result)
    assert "proposed" in table and "recorded" in table and "Service model" in table
    unchanged = what_if(result.trace, current, dataclasses.replace(current))  # equal: replayed once
    assert unchanged.proposed is unchanged.current


def test_admission_limits_refuse_in_the_replay_and_the_chart_shows_the_depth() -> None:
    group = config(PoolConfig("a", max_concurrent=1, max_queued=5), total=1)
    arrivals = arrivals_of([(0, "a", 1, 10)] * 20)
    result = replay(Workload(Trace.build(arrivals, start=0, end=100), group), group)
    a = result.pool("a")
    assert (a.launched, a.refused, a.peak_depth) == (5, 15, 5)  # one instant: all arrive, then a round
    assert a.depth[0] == 5 and max(a.depth) == 5 and a.depth[-1] == 0


def test_the_replay_stops_at_the_windows_end_and_counts_what_is_still_queued() -> None:
    group = config(PoolConfig("a", max_concurrent=1), total=1)
    arrivals = arrivals_of([(0, "a", 1, 10)] * 10)  # one slot, ten 10 s calls at once
    result = replay(Workload(Trace.build(arrivals, start=0, end=35), group), group).pool("a")
    # History of that window holds the four that ran by its end: so does the prediction.
    assert (result.launched, result.unserved) == (4, 6)
    assert result.wait[0.5] == 15.0 and result.wait[0.99] == pytest.approx(29.7)
    assert result.throughput_per_s == pytest.approx(3 / 35)  # completions inside the window


def test_a_paused_pool_serves_nothing_and_a_removed_pool_refuses_its_arrivals() -> None:
    group = config(PoolConfig("a", paused=True), PoolConfig("b"), total=2)
    arrivals = arrivals_of([(0, "a", 1, 1), (0, "b", 1, 1), (1, "gone", 1, 1)])
    result = replay(Workload(Trace.build(arrivals, end=FOREVER), group), group)
    assert (result.pool("a").launched, result.pool("a").unserved) == (0, 1)
    assert result.pool("b").launched == 1
    assert (result.pool("gone").arrivals, result.pool("gone").refused) == (1, 1)


def test_backend_max_in_flight_caps_the_replay() -> None:
    group = config(PoolConfig("a", max_concurrent=8), PoolConfig("b", max_concurrent=8), total=16, cap=3)
    arrivals = arrivals_of(synthetic(11, 200, ["a", "b"]))
    result = replay(Workload(Trace.build(arrivals, end=FOREVER), group), group)
    assert result.peak_backend_in_flight == {"sim": 3}
    assert len(result.launch_order) == 200


def test_the_service_fit_recovers_a_linear_slowdown_and_scales_calls() -> None:
    ks = [1 + k % 8 for k in range(200)]
    model = fit("sim", ks, [0.5 + 0.1 * k for k in ks])
    assert math.isclose(model.intercept, 0.5, abs_tol=1e-9) and math.isclose(model.slope, 0.1, abs_tol=1e-9)
    assert model.r2 is not None and model.r2 > 0.999
    assert math.isclose(model.scale(2, 4), 0.9 / 0.7)
    flat = fit("sim", [1, 2], [1.0, 0.5])  # too few calls: no slope
    assert flat.slope == 0.0 and flat.scale(1, 10) == 1.0
    assert in_flight_at_start([0, 0.5, 1, 3], [1, 2, 1.5, 4]) == [1, 2, 2, 1]
    assert in_flight_at_start([0, 0, 1], [2, 3, 2]) == [2, 2, 3]  # calls starting together see each other


def test_the_workload_fits_the_recorded_slowdown_and_a_replay_at_other_concurrency_scales_calls() -> None:
    # Bursts of k calls started together, far apart: each call ran 0.5 s + 0.1 s per call in flight.
    rows = [Arrival(100.0 * k, "a", 1, 0.5 + 0.1 * k, 0.0) for k in range(1, 9) for _ in range(k)]
    group = config(PoolConfig("a", max_concurrent=8), total=8, cap=8)
    workload = Workload(Trace.build(rows), group)
    line = workload.fits["sim"]
    assert (line.intercept, line.slope) == (pytest.approx(0.5), pytest.approx(0.1))
    assert "R² 1.00" in line.describe()
    last = len(workload.trace) - 1  # a call recorded with 8 in flight
    assert workload.service_time(last, 8) == pytest.approx(1.3)
    assert workload.service_time(last, 2) == pytest.approx(0.7)  # fewer at once: faster calls
    capped = replay(workload, apply_changes(group, ["a.max_concurrent=2"]))
    assert capped.peak_pool_in_flight["a"] == 2


pool_strategy = st.builds(
    lambda q, mx, mn, burst, paused, max_queued: PoolConfig(
        "",
        quantum=q,
        max_concurrent=mx,
        min_concurrent=min(mn, mx),
        max_burst_per_visit=burst,
        paused=paused,
        max_queued=max_queued,
    ),
    st.integers(1, 5),
    st.integers(1, 6),
    st.integers(0, 3),
    st.integers(1, 3),
    st.booleans(),
    st.none() | st.integers(1, 10),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pools=st.lists(pool_strategy, min_size=1, max_size=4),
    total=st.integers(1, 10),
    cap=st.none() | st.integers(1, 8),
    policy=st.sampled_from(["drr", "fifo"]),
    rows=st.lists(
        st.tuples(st.floats(0, 30), st.integers(0, 4), st.integers(1, 6), st.floats(0, 5)), max_size=80
    ),
)
def test_no_request_is_lost_or_duplicated_and_caps_hold(pools, total, cap, policy, rows) -> None:  # type: ignore[no-untyped-def]
    pools = [dataclasses.replace(p, pool_id=f"p{i}") for i, p in enumerate(pools)]
    total = max(total, sum(p.min_concurrent for p in pools if not p.paused))
    group = config(*pools, total=total, policy=policy, cap=cap)
    arrivals = [Arrival(t, f"p{k}", cost, ex, 0.0) for t, k, cost, ex in rows]  # p4.. may not exist
    trace = Trace.build(arrivals)
    result = replay(Workload(trace, group), group)
    order = list(result.launch_order)
    assert len(order) == len(set(order))  # launched at most once
    for outcome in result.pools:
        assert outcome.launched + outcome.refused + outcome.unserved == outcome.arrivals
    assert sum(o.arrivals for o in result.pools) == len(arrivals)
    assert result.peak_in_flight <= total
    for p in pools:
        assert result.peak_pool_in_flight[p.pool_id] <= p.max_concurrent
        if p.paused:
            assert result.pool(p.pool_id).launched == 0
        if p.max_queued is not None:
            assert result.pool(p.pool_id).peak_depth <= p.max_queued
    if cap is not None:
        assert all(v <= cap for v in result.peak_backend_in_flight.values())
    for i in order:
        assert result.launched_at[i] >= trace.enqueued_at[i]


@pytest.mark.parametrize(
    ("changes", "check"),
    [
        (["a.weight=3"], lambda g: g.pool("a").quantum == 3),
        (
            ["a.burst=2", "a.max_concurrent=5"],
            lambda g: (g.pool("a").max_burst_per_visit, g.pool("a").max_concurrent) == (2, 5),
        ),
        (["a.paused=true", "b.enabled=no"], lambda g: g.pool("a").paused and not g.pool("b").enabled),
        (
            ["a.max_queued=10", "a.max_queue_wait_s=2.5"],
            lambda g: g.pool("a").admission_limits().max_queued == 10,
        ),
        (["a.max_queued=", "a.max_queue_wait_s=none"], lambda g: not g.pool("a").admission_limits().bounded),
        (
            ["group.total_concurrency=3", "group.policy=fifo"],
            lambda g: (g.total_concurrency, g.policy) == (3, "fifo"),
        ),
        (["backend.sim.max_in_flight=2"], lambda g: g.backend("sim").max_in_flight == 2),
        (
            ["a.tenant_fairness=Tokens", "a.max_queued_per_tenant=3"],
            lambda g: (g.pool("a").tenant_fairness, g.pool("a").max_queued_per_tenant) == ("tokens", 3),
        ),
        (["a.tenant_fairness=off", "a.max_queued_per_tenant="], lambda g: g.pool("a").tenant_cost() is None),
    ],
)
def test_changes_are_applied_to_a_copy(changes, check) -> None:  # type: ignore[no-untyped-def]
    group = config(PoolConfig("a", max_queued=4), PoolConfig("b"), total=8, cap=16)
    changed = apply_changes(group, changes)
    assert check(changed)
    assert group.pool("a").quantum == 1 and group.total_concurrency == 8  # the original is untouched


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("a.weight=x", "weight invalid literal"),
        ("group.policy=lifo", "policy must be one of drr, fifo"),
        ("group.colour=red", "unknown group field 'colour'"),
        ("backend.nope.max_in_flight=2", "no such backend"),
        ("backend.sim.timeout_s=2", "unknown backend field 'timeout_s'"),
        ("a.backend=elsewhere", "uses no backend 'elsewhere'"),
        ("a.paused=maybe", "must be true or false"),
        ("a.tenant_fairness=loud", "tenant_fairness must be one of off, requests, tokens"),
        ("group.total_concurrency=1", None),  # fine alone
    ],
)
def test_bad_changes_say_which_and_why(change: str, message: str | None) -> None:
    group = config(PoolConfig("a"), PoolConfig("b"), total=8, cap=16)
    if message is None:
        apply_changes(group, [change])
        return
    with pytest.raises(BadChange) as caught:
        apply_changes(group, [change])
    assert message in str(caught.value) and repr(change) in str(caught.value)


def test_the_turnaround_is_the_gap_between_a_calls_end_and_the_launch_into_its_slot() -> None:
    # Two slots, always full: each call ends and the queued next one launches 20 ms later.
    calls, t = [], 0.0
    for _ in range(40):
        calls.append((0.0, t, t + 1.0))  # (enqueued, launched, ended): queued from the start
        calls.append((0.0, t + 0.5, t + 1.5))
        t += 1.02
    calls.sort(key=lambda c: c[1])
    measured = turnaround(calls, 2)
    assert measured.seconds == pytest.approx(0.02) and measured.points >= 70
    assert "20.0 ms" in measured.describe()
    # The same calls in a group of 4 never filled it: nothing to measure, no turnaround assumed.
    assert turnaround(calls, 4) == Turnaround(0.0, 0)
    # A request that arrived after the slot was free did not wait for it: no gap counted.
    idle = [(c[1], c[1], c[2]) for c in calls]
    assert turnaround(idle, 2).points == 0


def test_the_replays_rounds_come_the_turnaround_after_the_events_they_react_to() -> None:
    group = config(PoolConfig("a", max_concurrent=2), total=2)
    # Recorded: one call at a time, 1 s each, each next one launched 50 ms after the previous ended.
    rows = [Arrival(0.0, "a", 1, 1.0, 1.05 * k) for k in range(30)]
    rows.append(Arrival(40.0, "a", 1, 1.0, 0.05))
    rows.append(Arrival(40.01, "a", 1, 1.0, 0.04))  # in time for the same round
    workload = Workload(Trace.build(rows, end=FOREVER), apply_changes(group, ["group.total_concurrency=1"]))
    assert workload.turnaround.seconds == pytest.approx(0.05)
    result = replay(workload, apply_changes(group, ["a.max_concurrent=1", "group.total_concurrency=1"]))
    launched = [result.launched_at[i] for i in result.launch_order]
    assert launched[:3] == pytest.approx([0.05, 1.1, 2.15])  # an arrival waits for the round too
    both = replay(workload, group)  # two slots: the two late arrivals share one round (one decision)
    assert [both.launched_at[i] for i in (30, 31)] == pytest.approx([40.05, 40.05])


def test_a_refusal_without_a_recorded_cost_borrows_its_pools_costs() -> None:
    group = config(PoolConfig("a"), PoolConfig("b"), total=4)
    rows = [Arrival(float(k), "a", 4 if k % 2 else 2, 1.0, 0.0) for k in range(4)]
    rows += [Arrival(10.0 + k, "a", 0, refused=True) for k in range(4)]  # history recorded no cost
    rows += [Arrival(20.0, "b", 0, refused=True)]  # a pool with no recorded cost at all: 1
    workload = Workload(Trace.build(rows), group)
    assert [h.cost for h in workload.heads] == [2, 4, 2, 4, 2, 4, 2, 4, 1]
