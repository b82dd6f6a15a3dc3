"""Tests for runtime.policy.tenants: tables, then hypothesis invariants over a simulated pool."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runtime.policy.tenants import REQUESTS, TOKENS, TenantCost, TenantLedger, validate_tenant_weight

# ------------------------------------------------------------------------------------------------ tables


def test_pick_takes_the_smallest_counter_and_breaks_ties_by_id() -> None:
    ledger = TenantLedger({"b": 5.0, "a": 5.0, "c": 1.0}, backlogged=["a", "b", "c"])
    assert ledger.pick() == "c"
    ledger.charge("c", 10)
    assert ledger.pick() == "a"  # a and b tie at 5: the smaller id, as a sorted set orders them
    ledger.leave("a")
    assert ledger.pick() == "b"


def test_nobody_backlogged_picks_none() -> None:
    ledger = TenantLedger()
    assert ledger.pick() is None
    ledger.enter("a")
    ledger.leave("a")
    assert ledger.pick() is None


@pytest.mark.parametrize(
    ("weight", "cost", "counter"),
    [(1.0, 10, 10.0), (2.0, 10, 5.0), (0.5, 10, 20.0), (4.0, 1, 0.25)],
)
def test_charge_divides_by_the_weight(weight: float, cost: float, counter: float) -> None:
    ledger = TenantLedger(weights={"a": weight})
    ledger.enter("a")
    assert ledger.charge("a", cost) == counter


@pytest.mark.parametrize(
    ("mode", "estimate", "actual", "difference"),
    [
        (TOKENS, (100, 50), (100, 10), -160.0),  # output 40 tokens fewer at weight 4
        (TOKENS, (100, 50), (120, 50), 20.0),
        (TOKENS, (100, 50), None, 0.0),  # no usage reported: the estimate stands
        (REQUESTS, (100, 50), (1, 1), 0.0),  # a request costs 1 whatever it used
        (REQUESTS, (100, 50), None, 0.0),
    ],
)
def test_correction_is_actual_minus_estimate(
    mode: str, estimate: tuple[int, int], actual: tuple[int, int] | None, difference: float
) -> None:
    assert TenantCost(mode, 1.0, 4.0).correction(estimate, actual) == difference


@pytest.mark.parametrize(
    ("mode", "tokens", "cost"),
    [(REQUESTS, (1000, 1000), 1.0), (TOKENS, (10, 5), 30.0), (TOKENS, (-3, 5), 20.0), (TOKENS, (0, 0), 0.0)],
)
def test_cost_of_a_request(mode: str, tokens: tuple[int, int], cost: float) -> None:
    assert TenantCost(mode, 1.0, 4.0).of(*tokens) == cost


@pytest.mark.parametrize(
    "kwargs",
    [{"mode": "off"}, {"mode": "bytes"}, {"input_weight": -1.0}, {"output_weight": float("inf")},
     {"output_weight": float("nan")}],
)  # fmt: skip
def test_bad_cost_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"TenantCost|mode"):
        TenantCost(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_weights_are_refused(weight: float) -> None:
    with pytest.raises(ValueError, match="finite number above 0"):
        validate_tenant_weight(weight)
    with pytest.raises(ValueError, match="finite number above 0"):
        TenantLedger(weights={"a": weight})


def test_idle_tenant_re_enters_at_the_smallest_backlogged_counter() -> None:
    ledger = TenantLedger()
    for tenant in ("a", "b"):
        ledger.enter(tenant)
    ledger.charge("a", 5)
    ledger.leave("a")  # a goes idle at 5
    ledger.charge("b", 100)
    ledger.enter("c")
    assert ledger.counters["c"] == 100  # a newcomer starts at the floor, not at 0
    assert ledger.enter("a") == 100  # a banked nothing while away


def test_a_newcomer_enters_at_the_floor_even_after_a_busier_tenant_left() -> None:
    ledger = TenantLedger()
    ledger.enter("steady")
    ledger.enter("busy")
    ledger.charge("busy", 10)
    ledger.leave("busy")  # the last leaver sits at 10, the backlog's floor is still 0
    assert ledger.enter("new") == 0
    ledger.leave("steady")
    ledger.forget_idle()  # steady (0, idle, at the floor) is forgotten: it comes back at the floor
    assert ledger.enter("steady") == 0


def test_busy_tenant_keeps_its_higher_counter_on_re_entry() -> None:
    ledger = TenantLedger()
    ledger.enter("a")
    ledger.enter("b")
    ledger.charge("a", 50)
    ledger.leave("a")
    assert ledger.enter("a") == 50  # above the floor (b at 0): no debt is forgiven either


def test_with_nobody_backlogged_a_tenant_re_enters_at_the_last_leavers_counter() -> None:
    ledger = TenantLedger()
    ledger.enter("a")
    ledger.charge("a", 70)
    ledger.leave("a")
    assert ledger.floor() == 70
    assert ledger.enter("b") == 70


def test_entering_twice_changes_nothing() -> None:
    ledger = TenantLedger()
    ledger.enter("a")
    ledger.charge("a", 3)
    assert ledger.enter("a") == 3
    assert ledger.pick() == "a"


def test_correction_of_a_tenant_that_left_moves_its_remembered_counter() -> None:
    ledger = TenantLedger()
    ledger.enter("a")
    ledger.enter("b")
    ledger.charge("a", 100)
    ledger.leave("a")
    ledger.correct("a", -60)  # its call used less than estimated
    ledger.charge("b", 10)
    assert ledger.enter("a") == 40


def test_forget_idle_drops_only_counters_that_would_re_enter_at_the_floor() -> None:
    ledger = TenantLedger()
    for tenant in ("a", "b", "c"):
        ledger.enter(tenant)
    ledger.charge("a", 1)
    ledger.charge("b", 50)
    ledger.charge("c", 10)
    ledger.leave("a")
    ledger.leave("b")
    assert ledger.forget_idle() == 1  # a (1 <= floor 10) goes; b (50) keeps its debt
    assert set(ledger.counters) == {"b", "c"}


def test_state_round_trips_through_plain_numbers() -> None:
    ledger = TenantLedger(weights={"a": 2.0})
    for tenant in ("a", "b", "c"):
        ledger.enter(tenant)
    ledger.charge("a", 8)
    ledger.charge("b", 3)
    ledger.leave("c")
    copy = TenantLedger(ledger.counters, ledger.backlogged, last_left=ledger.last_left, weights={"a": 2.0})
    for _ in range(20):
        tenant = ledger.pick()
        assert tenant is not None and copy.pick() == tenant
        ledger.charge(tenant, 3)
        copy.charge(tenant, 3)
    assert copy.counters == ledger.counters


def test_repr_says_how_many_are_backlogged() -> None:
    ledger = TenantLedger()
    ledger.enter("a")
    assert repr(ledger) == "<TenantLedger backlogged=1 counters=1 floor=0>"


def test_the_heap_stays_compact_when_one_tenant_is_charged_many_times() -> None:
    ledger = TenantLedger()
    for tenant in ("a", "b"):
        ledger.enter(tenant)
    for _ in range(10_000):
        ledger.charge("a", -0.0 if ledger.pick() == "b" else 1)
        ledger.charge("b", 1)
    assert len(ledger._heap) <= 4 * 2 + 64


# ------------------------------------------------------------------------------------------- simulation


@dataclass
class Pool:
    """A pool running ``concurrency`` calls at once for backlogged tenants, driven by a TenantLedger."""

    ledger: TenantLedger
    cost: TenantCost
    concurrency: int
    served: dict[str, float] = field(default_factory=dict)  # completed work / weight, per tenant
    in_flight: list[tuple[str, tuple[int, int], tuple[int, int] | None]] = field(default_factory=list)

    def launch(self, estimate: tuple[int, int], actual: tuple[int, int] | None) -> str:
        tenant = self.ledger.pick()
        assert tenant is not None
        self.ledger.charge(tenant, self.cost.of(*estimate))
        self.in_flight.append((tenant, estimate, actual))
        return tenant

    def complete(self, index: int) -> str:
        tenant, estimate, actual = self.in_flight.pop(index)
        self.ledger.correct(tenant, self.cost.correction(estimate, actual))
        used = self.cost.of(*(actual if actual is not None else estimate))
        self.served[tenant] = self.served.get(tenant, 0.0) + used / self.ledger.weight(tenant)
        return tenant


tokens = st.tuples(st.integers(0, 400), st.integers(0, 100))
request = st.tuples(tokens, st.one_of(st.none(), tokens))


def largest_cost(cost: TenantCost) -> float:
    return cost.of(400, 100)


def run_backlogged(
    pool: Pool, requests: list[tuple[tuple[int, int], tuple[int, int] | None]], seed: int
) -> list[dict[str, float]]:
    """Every tenant stays backlogged; each completion frees a slot that the next pick fills.
    Returns the weighted service of every tenant after each completion."""
    rng = random.Random(seed)
    feed = iter(requests)
    for estimate, actual in (next(feed) for _ in range(pool.concurrency)):
        pool.launch(estimate, actual)
    history = []
    for estimate, actual in feed:
        pool.complete(rng.randrange(len(pool.in_flight)))
        history.append(dict(pool.served))
        pool.launch(estimate, actual)
    return history


@settings(max_examples=200, deadline=None)
@given(
    requests=st.lists(request, min_size=20, max_size=300),
    concurrency=st.integers(1, 6),
    mode=st.sampled_from([REQUESTS, TOKENS]),
    seed=st.integers(0, 1000),
)
def test_two_backlogged_tenants_never_differ_by_more_than_the_bound(
    requests: list[tuple[tuple[int, int], tuple[int, int] | None]], concurrency: int, mode: str, seed: int
) -> None:
    if len(requests) <= concurrency:
        return
    cost = TenantCost(mode, 1.0, 4.0)
    ledger = TenantLedger()
    ledger.enter("a")
    ledger.enter("b")
    pool = Pool(ledger, cost, concurrency)
    history = run_backlogged(pool, requests, seed)
    gaps = [0.0, *(h.get("a", 0.0) - h.get("b", 0.0) for h in history)]
    # Over ANY interval in which both are backlogged, service differs by at most the bound: the
    # interval's difference is gap(t2) - gap(t1).
    assert max(gaps) - min(gaps) <= 2 * largest_cost(cost) * concurrency + 1e-6


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0, 0.5]), min_size=2, max_size=5),
    concurrency=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_weighted_service_converges_to_the_weights(weights: list[float], concurrency: int, seed: int) -> None:
    rng = random.Random(seed)
    names = [f"t{i}" for i in range(len(weights))]
    ledger = TenantLedger(weights=dict(zip(names, weights, strict=True)))
    for name in names:
        ledger.enter(name)
    cost = TenantCost(TOKENS, 1.0, 4.0)
    pool = Pool(ledger, cost, concurrency)
    requests = [((rng.randrange(400), rng.randrange(100)), None) for _ in range(3000)]
    run_backlogged(pool, requests, seed)
    served = [pool.served.get(n, 0.0) for n in names]  # already divided by the weights
    bound = 2 * largest_cost(cost) * concurrency / min(weights)
    assert max(served) - min(served) <= bound
    total = sum(pool.served[n] * w for n, w in zip(names, weights, strict=True))
    for name, weight in zip(names, weights, strict=True):
        share = pool.served[name] * weight / total
        assert share == pytest.approx(weight / sum(weights), rel=0.05)


@settings(max_examples=100, deadline=None)
@given(
    tenants=st.integers(2, 30),
    arrivals=st.lists(st.tuples(st.integers(0, 29), st.integers(1, 5)), min_size=1, max_size=200),
    concurrency=st.integers(1, 5),
)
def test_no_backlogged_tenant_starves(
    tenants: int, arrivals: list[tuple[int, int]], concurrency: int
) -> None:
    """Tenants come and go with bursts of work (requests mode, every request costs 1). While one
    waits, no other tenant launches more than twice: once to catch up with its counter (a newcomer
    enters at the floor, never below it), once more on a tie won by a smaller id."""
    ledger = TenantLedger()
    queues: dict[str, int] = {}
    ahead: dict[str, dict[str, int]] = {}  # waiting tenant -> launches of each other tenant since
    for tenant_index, burst in arrivals:
        tenant = f"t{tenant_index % tenants}"
        if not queues.get(tenant):
            ledger.enter(tenant)
            ahead[tenant] = {}
        queues[tenant] = queues.get(tenant, 0) + burst
        for _ in range(concurrency):
            picked = ledger.pick()
            if picked is None:
                break
            ledger.charge(picked, 1)
            queues[picked] -= 1
            ahead[picked] = {}
            for other in ledger.backlogged - {picked}:
                ahead[other][picked] = ahead[other].get(picked, 0) + 1
                assert ahead[other][picked] <= 2
            if not queues[picked]:
                ledger.leave(picked)


@settings(max_examples=100, deadline=None)
@given(
    busy_launches=st.integers(0, 200),
    away_cost=st.integers(1, 50),
)
def test_idle_time_banks_no_credit(busy_launches: int, away_cost: int) -> None:
    """A tenant that left and comes back gets no more than a tenant that never left would: its
    counter is at least the floor, so it cannot monopolise the pool to catch up."""
    ledger = TenantLedger()
    ledger.enter("steady")
    ledger.enter("away")
    ledger.charge("away", away_cost)
    ledger.leave("away")
    for _ in range(busy_launches):
        ledger.charge("steady", 1)
    counter = ledger.enter("away")
    assert counter >= ledger.counters["steady"]
    run = 0
    while ledger.pick() == "away":
        ledger.charge("away", 1)
        run += 1
    assert run <= 1  # one launch brings it past the steady tenant: no burst of banked credit


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from(["enter", "leave", "charge", "correct"]),
                          st.integers(-20, 50)), max_size=200))  # fmt: skip
def test_pick_always_matches_a_scan_of_the_backlog(ops: list[tuple[str, str, int]]) -> None:
    """The heap is only an index: the answer is always the textbook min over the backlogged set."""
    ledger = TenantLedger(weights={"b": 2.0, "e": 0.5})
    for tenant, op, amount in ops:
        if op == "enter":
            ledger.enter(tenant)
        elif op == "leave":
            ledger.leave(tenant)
        elif op == "charge":
            ledger.charge(tenant, abs(amount))
        else:
            ledger.correct(tenant, amount)
        expected = min(((ledger.counters[t], t) for t in ledger.backlogged), default=None)
        assert ledger.pick() == (expected[1] if expected else None)


# ------------------------------------------------------------------------------------ plan from a view

from runtime.policy.tenants import plan_picks  # noqa: E402


def test_plan_stops_at_the_horizon_and_at_an_unread_head() -> None:
    view = TenantLedger({"a": 0.0, "b": 2.0}, backlogged=["a", "b"])
    heads = {"a": [1, 1, 1, 1, 1], "b": [1, 1, 1]}
    picks = plan_picks(view, heads, {"a": 9, "b": 9}, 10, horizon=(3.0, "c"))
    # a at 0, 1, 2 (a tie with b at 2 goes to "a"), b at 2, then a and b at 3 (both sort before the
    # unseen c at 3); a at 4 would come after c: stop.
    assert [t for t, _ in picks] == ["a", "a", "a", "b", "a", "b"]
    empty = TenantLedger({"a": 0.0}, backlogged=["a"])
    assert plan_picks(empty, {"a": [5]}, {"a": 3}, 10) == [("a", 5)]  # its 2nd request was not read


def test_plan_empties_a_queue_and_the_tenant_leaves() -> None:
    view = TenantLedger({"a": 0.0, "b": 0.0}, backlogged=["a", "b"])
    picks = plan_picks(view, {"a": [1], "b": [1, 1, 1]}, {"a": 1, "b": 3}, 10)
    assert picks == [("a", 1), ("b", 1), ("b", 1), ("b", 1)]
    assert view.backlogged == set()


@settings(max_examples=150, deadline=None)
@given(
    counters=st.dictionaries(st.sampled_from("abcdefghij"), st.integers(0, 20), min_size=1),
    costs=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    window=st.integers(1, 10),
    launches=st.integers(1, 30),
)
def test_a_plan_from_the_lowest_counters_agrees_with_the_whole_backlog(
    counters: dict[str, int], costs: list[int], window: int, launches: int
) -> None:
    """What one read of the lowest ``window`` counters allows is exactly what the whole state picks."""
    queued = {t: len(costs) for t in counters}
    heads = {t: costs for t in counters}
    whole = TenantLedger(counters, backlogged=counters)
    full = plan_picks(whole, heads, queued, launches)
    ordered = sorted((float(c), t) for t, c in counters.items())
    seen, rest = ordered[:window], ordered[window:]
    view = TenantLedger({t: c for c, t in seen}, backlogged=[t for _, t in seen])
    partial = plan_picks(view, heads, queued, launches, horizon=rest[0] if rest else None)
    assert partial == full[: len(partial)]
    assert partial  # a view of the lowest tenant always allows its first pick


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcd"),
            st.sampled_from(["submit", "launch", "launch", "complete", "forget"]),
            st.integers(0, 30),
        ),
        max_size=300,
    )
)
@example(  # b is forgotten at the floor; c then leaves far above it while d keeps the floor low
    [("b", "submit", 0), ("c", "submit", 0), ("d", "submit", 0), ("b", "launch", 0), ("b", "complete", 0),
     ("b", "forget", 0), ("c", "launch", 30), ("b", "submit", 0)]
)  # fmt: skip
def test_forgetting_idle_tenants_changes_no_decision_while_corrections_are_upward(
    ops: list[tuple[str, str, int]],
) -> None:
    """A pool's run with forget_idle called now and then picks exactly as one that never forgets,
    as long as tenants with calls in flight are kept and no correction goes down."""
    kept, forgetful = TenantLedger(), TenantLedger()
    queued: dict[str, int] = {}
    flying: list[tuple[str, int]] = []
    for tenant, op, amount in ops:
        if op == "submit":
            queued[tenant] = queued.get(tenant, 0) + 1
            assert kept.enter(tenant) == forgetful.enter(tenant)
        elif op == "launch":
            picked = kept.pick()
            assert forgetful.pick() == picked
            if picked is None:
                continue
            kept.charge(picked, amount)
            forgetful.charge(picked, amount)
            flying.append((picked, amount))
            queued[picked] -= 1
            if not queued[picked]:
                kept.leave(picked)
                forgetful.leave(picked)
        elif op == "complete" and flying:
            done, extra = flying.pop(amount % len(flying))
            kept.correct(done, extra)
            forgetful.correct(done, extra)
        elif op == "forget":
            forgetful.forget_idle(in_flight={t for t, _ in flying})
        for t in forgetful.counters:
            assert forgetful.counters[t] == kept.counters[t]
