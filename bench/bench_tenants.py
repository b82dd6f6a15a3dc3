"""Fairness between the tenants of a pool (issue 22).

Run: ``python bench/bench_tenants.py --pure``. Times the pure tenant scheduler
(:class:`runtime.policy.tenants.TenantLedger`) alone, per launch, as the number of backlogged tenants
of one pool grows (10 / 1,000 / 10,000), median of several runs:

* ``steady``: every tenant stays backlogged; a launch is pick + charge by the estimate, and a
  completion (one launch later) corrects by the difference with the actual usage.
* ``churn``: every tenant has one queued request; a launch is enter (at the floor) + pick + charge
  + leave, the worst case for the backlog index.
* ``plan``: what a dispatcher's round will do: build a view of the 16 lowest counters (what one
  ``ZRANGE 0 15 WITHSCORES`` returns) and plan 8 launches from it (:func:`plan_picks`); per round.
* ``scan``: ``steady`` with a linear scan for the minimum instead of the heap, for comparison: what
  a pick would cost without the index.

Then, still pure and in virtual time, token fairness between two always-backlogged tenants (weights
1:1 and 2:1) on 8 slots: the worst share deviation over any 60 s window, and the largest service gap
against the bound 2 x largest cost x concurrency.

Without ``--pure``: the noisy-neighbour, token-fairness and throughput scenarios with a private
Valkey, a simulator process and a dispatcher process (``bench/_tenants_live.py`` says what each does);
``--part noisy|fairness|cost`` (repeatable) runs some of them, ``--runs`` is the number of runs of the
noisy neighbour and of off/tokens pairs of each throughput scenario (``churn``: 256 calls in flight
over 1,000 tenants, each tenant entering and leaving with every call; ``backlogged``: all 1,000
tenants backlogged the whole window), ``--fair-seconds`` the length of each live fairness run (the
per-60 s-window check needs a few windows). ``--before REF`` (with ``cost``) also runs git revision
REF's ``tokens`` in each pair (exported to a scratch directory), for a same-run baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import exported, machine, table
from runtime.policy.tenants import TOKENS, TenantCost, TenantLedger, plan_picks

TENANT_COUNTS = (10, 1_000, 10_000)
RUNS = 5
LAUNCHES = 20_000
COST = TenantCost(TOKENS, 1.0, 4.0)


def _requests(seed: int) -> list[tuple[tuple[int, int], tuple[int, int] | None]]:
    rng = random.Random(seed)
    out = []
    for _ in range(LAUNCHES):
        estimate = (rng.randint(50, 2000), rng.randint(16, 512))
        actual = None if rng.random() < 0.1 else (estimate[0], rng.randint(1, estimate[1]))
        out.append((estimate, actual))
    return out


def _ledger(n: int, seed: int) -> TenantLedger:
    rng = random.Random(seed)
    weights = {f"t{i:05d}": rng.choice((1.0, 1.0, 2.0, 0.5)) for i in range(n)}
    ledger = TenantLedger(weights=weights)
    for tenant in weights:
        ledger.enter(tenant)
    return ledger


def steady(n: int, seed: int, *, scan: bool = False) -> float:
    """Nanoseconds per launch (pick + charge + the previous launch's correction)."""
    ledger = _ledger(n, seed)
    requests = _requests(seed)
    previous: tuple[str, tuple[int, int], tuple[int, int] | None] | None = None
    start = time.perf_counter_ns()
    for estimate, actual in requests:
        if scan:
            tenant = min((ledger.counters[t], t) for t in ledger.backlogged)[1]
        else:
            tenant = ledger.pick()
            assert tenant is not None
        ledger.charge(tenant, COST.of(*estimate))
        if previous is not None:
            ledger.correct(previous[0], COST.correction(previous[1], previous[2]))
        previous = (tenant, estimate, actual)
    return (time.perf_counter_ns() - start) / len(requests)


def churn(n: int, seed: int) -> float:
    """Nanoseconds per launch when every launch empties its tenant's sub-queue and another enters."""
    ledger = _ledger(n, seed)
    requests = _requests(seed)
    start = time.perf_counter_ns()
    for estimate, _ in requests:
        tenant = ledger.pick()
        assert tenant is not None
        ledger.charge(tenant, COST.of(*estimate))
        ledger.leave(tenant)
        ledger.enter(tenant)  # it comes back at once, at the floor or above
    return (time.perf_counter_ns() - start) / len(requests)


WINDOW = 16
ROUND_LAUNCHES = 8
ROUNDS = 300


def plan(n: int, seed: int) -> float:
    """Nanoseconds per round: a view of the WINDOW lowest counters, then ROUND_LAUNCHES picks.

    Finding the lowest counters is the sorted set's work in Valkey (``ZRANGE``, O(log n + k)), so it
    is done outside the timed part, here by a scan.
    """
    ledger = _ledger(n, seed)
    rng = random.Random(seed)
    heads = {t: [float(rng.randint(100, 4000)) for _ in range(4)] for t in ledger.counters}
    queued = dict.fromkeys(ledger.counters, 100)
    weights = {t: ledger.weight(t) for t in ledger.counters}
    elapsed = 0
    for _ in range(ROUNDS):
        lowest = heapq.nsmallest(WINDOW + 1, ((c, t) for t, c in ledger.counters.items()))
        start = time.perf_counter_ns()
        seen = lowest[:WINDOW]
        view = TenantLedger(
            {t: c for c, t in seen}, [t for _, t in seen], weights={t: weights[t] for _, t in seen}
        )
        picks = plan_picks(
            view, heads, queued, ROUND_LAUNCHES, horizon=lowest[WINDOW] if n > WINDOW else None
        )
        elapsed += time.perf_counter_ns() - start
        for tenant, cost in picks:
            ledger.charge(tenant, cost)  # what the claims do in Valkey
    return elapsed / ROUNDS


SIM_SECONDS = 600.0
SIM_WINDOW_S = 60.0
SIM_CONCURRENCY = 8


def fairness(weights: tuple[float, float], seed: int) -> tuple[float, float, float]:
    """Two always-backlogged tenants on a pool of SIM_CONCURRENCY slots, in virtual time: a call
    lasts 20 ms + 10 ms per output token, charged its estimate at launch and corrected at the end.

    Returns the largest deviation of a tenant's weighted-token share from its weight's share over
    any 60 s window (sliding by 1 s, in %), the largest gap in weighted service between the two over
    any interval, and that gap's bound (2 x largest cost x concurrency).
    """
    rng = random.Random(seed)
    ledger = TenantLedger(weights={"a": weights[0], "b": weights[1]})
    ledger.enter("a")
    ledger.enter("b")
    running: list[tuple[float, int, str, tuple[int, int], tuple[int, int]]] = []
    served: list[tuple[float, str, float]] = []  # (end time, tenant, weighted cost)
    clock, seq = 0.0, 0

    def launch() -> None:
        nonlocal seq
        tenant = ledger.pick()
        assert tenant is not None
        estimate = (rng.randint(50, 2000), 512)
        actual = (estimate[0], rng.randint(1, 512))
        ledger.charge(tenant, COST.of(*estimate))
        heapq.heappush(running, (clock + 0.02 + 0.01 * actual[1], seq, tenant, estimate, actual))
        seq += 1

    for _ in range(SIM_CONCURRENCY):
        launch()
    while clock < SIM_SECONDS:
        clock, _, tenant, estimate, actual = heapq.heappop(running)
        ledger.correct(tenant, COST.correction(estimate, actual))
        served.append((clock, tenant, COST.of(*actual) / ledger.weight(tenant)))
        launch()
    gap, low, high = 0.0, 0.0, 0.0
    for _, tenant, cost in served:
        gap += cost if tenant == "a" else -cost
        low, high = min(low, gap), max(high, gap)
    worst = 0.0
    expected = weights[0] / sum(weights)
    for start in range(int(SIM_SECONDS - SIM_WINDOW_S)):
        got = {"a": 0.0, "b": 0.0}
        for end, tenant, cost in served:
            if start <= end < start + SIM_WINDOW_S:
                got[tenant] += cost * ledger.weight(tenant)
        worst = max(worst, abs(got["a"] / (got["a"] + got["b"]) - expected) / expected * 100)
    return worst, high - low, 2 * COST.of(2000, 512) * SIM_CONCURRENCY


def scan(n: int, seed: int) -> float:
    return steady(n, seed, scan=True)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--pure", action="store_true", help="the pure tenant scheduler alone (no Valkey)")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument(
        "--part",
        action="append",
        choices=("noisy", "fairness", "cost"),
        help="live parts to run (default: all)",
    )
    parser.add_argument("--fair-seconds", type=float, default=150.0, help="length of each live fairness run")
    parser.add_argument("--before", help="git revision whose tokens run joins each cost pair (git archive)")
    args = parser.parse_args()
    if not args.pure:
        parts = tuple(args.part or ("noisy", "fairness", "cost"))
        with contextlib.ExitStack() as stack:
            before = stack.enter_context(exported(args.before)) if args.before else None
            live(args.runs, parts, args.fair_seconds, before)
        return
    rows = []
    for n in TENANT_COUNTS:
        row: list[object] = [f"{n:,}"]
        for scenario, runs in ((steady, args.runs), (churn, args.runs), (plan, args.runs), (scan, 1)):
            times = [scenario(n, seed) for seed in range(runs)]
            row.append(f"{statistics.median(times) / 1000:.2f}")
        rows.append(row)
    print(machine())
    print(f"TenantLedger, µs per launch, median of {args.runs} runs x {LAUNCHES:,} launches (scan: 1 run)")
    print(table(["backlogged tenants", "steady", "churn", "plan (per round)", "scan (no index)"], rows))
    rows = []
    for weights in ((1.0, 1.0), (2.0, 1.0)):
        worst, gap, bound = fairness(weights, seed=1)
        rows.append([f"{weights[0]:g}:{weights[1]:g}", f"{worst:.2f} %", f"{gap:,.0f}", f"{bound:,.0f}"])
    print()
    print(
        f"Two backlogged tenants, {SIM_CONCURRENCY} slots, {SIM_SECONDS:.0f} virtual s "
        "(calls 20 ms + 10 ms per output token; estimate 512 output tokens, actual 1-512)"
    )
    print(table(["weights", "worst 60 s share deviation", "largest gap", "bound 2 x M x C"], rows))


def _load() -> str:
    return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


def live(runs: int, parts: tuple[str, ...], fair_seconds: float, before: Path | None = None) -> None:
    from bench import _tenants_live

    print(machine())
    print(f"start: {_load()}")
    results = _tenants_live.run(runs, parts, fair_seconds, before)
    print(f"end: {_load()}")
    if "noisy" in parts:
        print()
        print(
            "Noisy neighbour: one pool, 4 slots, 40 ms calls; A queues 600, B submits every 100 ms "
            f"(median of {runs})"
        )
        rows = [
            [mode, f"{r['b_p50']:.0f}", f"{r['b_p99']:.0f}", f"{r['next_p99']:.0f}"]
            for mode, r in ((m, results[f"noisy:{m}"]) for m in ("off", "tokens"))
        ]
        print(
            table(
                ["fairness", "B wait p50 ms", "B wait p99 ms", "submission to next completion p99 ms"], rows
            )
        )
    if "fairness" in parts:
        print()
        print(
            f"Token fairness, live: two backlogged tenants, {_tenants_live.SHARE_SLOTS} slots, "
            f"{fair_seconds:.0f} s each; A's calls ~30x B's prompt and 64 output tokens, B's 16; "
            "every 60 s window sliding by 5 s"
        )
        rows = []
        for name in ("1:1", "2:1"):
            r = results[f"share:{name}"]
            rows.append(
                [
                    name, f"{r['completions']:.0f}", f"{r['share'] * 100:.1f} %",
                    f"{r['wanted'] * 100:.1f} %", f"{r['windows']:.0f}", f"{r['worst_window_pct']:.2f} %",
                    f"{r['gap']:,.0f}", f"{r['bound']:,.0f}",
                    f"{r['empty_a']:.0f} / {r['empty_b']:.0f} of {r['samples']:.0f}",
                ]
            )  # fmt: skip
        headers = [
            "weights A:B", "completions", "A's share of tokens", "A's weighted share", "60 s windows",
            "worst window deviation", "largest weighted gap", "bound 2 x M x C",
            "list empty A / B (10 ms samples)",
        ]  # fmt: skip
        print(table(headers, rows))
    if "cost" in parts:
        window, warmup = _tenants_live.BACKLOG_WINDOW, _tenants_live.BACKLOG_WARMUP
        for scenario, title in (
            (
                "churn",
                "Throughput, churn: 4,000 zero-latency calls from 1,000 tenants, 256 in flight, 64 slots",
            ),
            (
                "backlogged",
                "Throughput, backlogged: 1,000 tenants all backlogged (4 calls outstanding each, 4,000 "
                f"in flight), 64 slots, {window:,} zero-latency completions measured after {warmup:,}",
            ),
        ):
            _cost_table(results[f"cost:{scenario}"], runs, title, sampled=scenario == "backlogged")


def _cost_table(pairs: list[dict[str, dict[str, float]]], runs: int, title: str, *, sampled: bool) -> None:
    sides = ["off", *(["before"] if "before" in pairs[0] else []), "tokens"]
    fair = sides[1:]
    print()
    print(
        f"{title}; {' / '.join(sides)} alternated, {runs} runs each; CPU µs per completion"
        + ("; before: the --before revision's tokens" if "before" in sides else "")
        + ("; backlogged: fewest backlogged tenants sampled every 100 ms in the window" if sampled else "")
    )
    rows = []
    for i, pair in enumerate(pairs):
        row: list[object] = [i + 1, *(f"{pair[side]['rate']:.0f}" for side in sides)]
        row += [f"{pair[side]['rate'] / pair['off']['rate']:.2f}" for side in fair]
        for process in ("dispatcher", "valkey", "producer"):
            row.append(" / ".join(f"{pair[side][process]:.0f}" for side in sides))
        row.append(" / ".join(f"{_total(pair[side]):.0f}" for side in sides))
        row += [f"{_total(pair['off']) / _total(pair[side]):.2f}" for side in fair]
        if sampled:
            row.append(" / ".join(f"{pair[side]['backlogged']:.0f}" for side in fair))
        rows.append(row)
    medians = {side: statistics.median(p[side]["rate"] for p in pairs) for side in sides}
    cpu = {
        side: {k: statistics.median(p[side][k] for p in pairs) for k in ("dispatcher", "valkey", "producer")}
        for side in sides
    }
    row = ["median", *(f"{medians[side]:.0f}" for side in sides)]
    for side in fair:
        row.append(f"{statistics.median(p[side]['rate'] / p['off']['rate'] for p in pairs):.2f}")
    for process in ("dispatcher", "valkey", "producer"):
        row.append(" / ".join(f"{cpu[side][process]:.0f}" for side in sides))
    row.append(" / ".join(f"{statistics.median(_total(p[side]) for p in pairs):.0f}" for side in sides))
    for side in fair:
        row.append(f"{statistics.median(_total(p['off']) / _total(p[side]) for p in pairs):.2f}")
    if sampled:
        row.append("")
    rows.append(row)
    names = " / ".join(sides)
    headers = [
        "pair", *(f"{side} /s" for side in sides), *(f"{side} ratio" for side in fair),
        f"dispatcher {names}", f"Valkey {names}", f"producer {names}", f"CPU total {names}",
        *(f"{side} CPU ratio" for side in fair), *([f"backlogged {' / '.join(fair)}"] if sampled else []),
    ]  # fmt: skip
    print(table(headers, rows))
    unanswered = [int(p[side].get("unanswered", 0)) for p in pairs for side in sides]
    if any(unanswered):
        print(f"calls not answered within the drain after the window, per run: {unanswered}")


def _total(side: dict[str, float]) -> float:
    """CPU µs per completion of the three processes: on 2 cores the throughput's bound."""
    return side["dispatcher"] + side["valkey"] + side["producer"]


if __name__ == "__main__":
    main()
