"""A fleet of dispatchers: does it behave as one? 1, 2 and 3 dispatcher processes of one group.

Run: ``python bench/bench_fleet.py [--quick] [--runs N] [--before REF] [--fleets 1,3] [--group-total T]
[--slots S] [--lone-slots K]``.

With ``--before REF`` every configuration also runs the dispatchers of git revision ``REF``
(exported with git archive) right after this checkout's, in the same Valkey and against the same
simulator, so each variant's "n dispatchers vs 1" ratio and the after/before ratio come from one run.

Where the fleet's extra cost comes from (issue 23): ``--lone-slots K`` also runs one dispatcher whose
own concurrency is ``K`` (the group total unchanged), i.e. with the slots a fleet member holds (3 of 8
with three dispatchers), so "n vs 1" can be read against a lone dispatcher that batches from as few
slots. ``--group-total T --slots S`` sets the group total (and the pools' caps) and each dispatcher's
own concurrency: ``--group-total 24 --slots 8`` gives three dispatchers 8 slots each (``fleet_share``
of 24 over 3 x 8) against one dispatcher of 8 slots, equal slots per dispatcher.

Like bench_fairness: every pool is preloaded so it stays backlogged (costs uniform in 1..4 for even
pools, 1..16 for odd pools, seeded), a zero-latency simulator process, group total 8
(``--group-total``), each dispatcher with 8 local slots (``--slots``), so the scheduler decides who
gets every slot. The dispatched cost share is read from the lists (items gone from each head), not
from the dispatchers' counters.

Each configuration runs without and with *live wake-ups*: a producer pushes real requests into the
pools at ~500/s (at the tail, behind the backlog) and, so that wake-ups really flow whatever the
wake-up rule is, a wake token with each push (worst case: every push wakes a dispatcher).

Measured per configuration: max share error (pp) and Jain index (share/target), lost claims per
completion, each dispatcher's share of the completions (max deviation from an even split), throughput,
Valkey commands and Valkey CPU (user+sys) per completion (``INFO commandstats`` / ``INFO cpu`` deltas
over the measured window), the dispatchers' CPU per completion (all processes summed, /proc deltas over
the same window), rounds that found the turn taken per completion, Valkey round trips of the rounds
and of the FINISH batches per completion (and finishes per FINISH trip: how much the batcher
coalesces), and cap / protected-slot violations in 10 ms samples (each sample one MULTI over the
lease sets and lists). In 4:1 the heavy pool has two protected slots (min concurrent 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    CALL,
    ROOT,
    client,
    cpu_seconds,
    exported,
    group,
    machine,
    median,
    new_keys,
    preload,
    private_valkey,
    publish,
    scratch,
    simulator_proc,
    spawn,
    stop_proc,
    table,
)
from bench.bench_fairness import jain
from runtime.policy import scheduler
from runtime.producer import Producer
from runtime.queue import registry
from runtime.queue.keys import WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS, KeySpace
from runtime.valkey.lua import run_pipeline
from runtime.wire.contract import ChatCall, Envelope, Metadata
from runtime.wire.groupconfig import GroupConfig, PoolConfig

SCENARIOS = {"4:1": (4, 1), "1:1:2:4": (1, 1, 2, 4)}
FLEETS = (1, 2, 3)
GROUP_TOTAL = 8
LIVE_RATE = 500.0  # pushes per second with live wake-ups
SAMPLE_S = 0.01
WAKE = registry.script("wake")
PUSH_SCRIPT = registry.script("push")


@contextlib.contextmanager
def fleet(
    url: str, prefix: str, group_id: str, count: int, root: Path = ROOT, slots: int = GROUP_TOTAL
) -> Iterator[tuple[list[dict[str, Any]], list[subprocess.Popen[str]]]]:
    """``count`` dispatcher processes of ``slots`` local slots each; yields a list that gets each one's
    exit stats once they stopped, and the processes (for their CPU time)."""
    with scratch() as stats_dir:
        stats: list[dict[str, Any]] = []
        paths = [stats_dir / f"d{i}.json" for i in range(count)]
        with _processes(url, prefix, group_id, paths, root, slots) as procs:
            yield stats, procs
        stats.extend(orjson.loads(path.read_bytes()) for path in paths)


@contextlib.contextmanager
def _processes(
    url: str, prefix: str, group_id: str, paths: list[Path], root: Path, slots: int
) -> Iterator[list[subprocess.Popen[str]]]:
    procs = [
        spawn(
            ["-m", "bench._dispatcher_proc", url, prefix, group_id, str(slots), f"d{i}"],
            env={"BENCH_STATS": str(path)},
            root=root,
        )
        for i, path in enumerate(paths)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            if "ready" not in proc.stdout.readline():
                raise RuntimeError("dispatcher did not start")
        yield procs
    finally:
        for proc in procs:
            stop_proc(proc)


async def live_pushes(
    conn: Any, keys: KeySpace, producer_id: str, pushed: dict[str, int], stop: asyncio.Event
) -> None:
    """Pushes one request (+ a wake token) every 1/LIVE_RATE s, round robin; counts them in ``pushed``."""
    chat = ChatCall.from_openai(CALL)
    pools, count, started = list(pushed), 0, time.perf_counter()
    while not stop.is_set():
        pool_id = pools[count % len(pools)]
        raw = Envelope(
            request_id=uuid.uuid4().hex,
            producer_id=producer_id,
            pool_id=pool_id,
            call=chat,
            enqueued_at=time.time(),
            deadline=time.time() + 3600,
            metadata=Metadata(cost_units=1),
        ).encode()

        def build(pipe: Any, pool_id: str = pool_id, raw: bytes = raw) -> None:
            args = [WAKE_TOKEN_CAP, WAKE_TOKEN_TTL_MS]
            PUSH_SCRIPT.queue(pipe, [keys.requests(pool_id), keys.wake_list(pool_id)], [raw, *args])
            WAKE.queue(pipe, [keys.wake_list(pool_id)], args)

        await run_pipeline(conn, [PUSH_SCRIPT, WAKE], build)
        pushed[pool_id] += 1
        count += 1
        delay = started + count / LIVE_RATE - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


async def valkey_counters(conn: Any) -> tuple[int, float]:
    stats = await conn.info("commandstats")
    cpu = await conn.info("cpu")
    calls = sum(int(v["calls"]) for v in stats.values())
    return calls, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


async def sample_caps(conn: Any, keys: KeySpace, config: GroupConfig, stop: asyncio.Event) -> tuple[int, int]:
    """(samples, violations): a cap exceeded, or others inside a backlogged pool's protected slots."""
    samples = violations = 0
    pools = config.pools
    while not stop.is_set():
        async with conn.pipeline(transaction=True) as pipe:
            pipe.zcard(keys.group_inflight(config.group_id))
            for p in pools:
                pipe.zcard(keys.pool_inflight(p.pool_id))
                pipe.llen(keys.requests(p.pool_id))
            res = await pipe.execute()
        in_group, per_pool = res[0], res[1:]
        owed = sum(
            max(0, p.min_concurrent - per_pool[2 * i]) for i, p in enumerate(pools) if per_pool[2 * i + 1] > 0
        )
        over_cap = any(per_pool[2 * i] > p.max_concurrent for i, p in enumerate(pools))
        if in_group > config.total_concurrency or over_cap or in_group + owed > config.total_concurrency:
            violations += 1
        samples += 1
        await asyncio.sleep(SAMPLE_S)
    return samples, violations


async def one_run(
    valkey_url: str,
    sim_url: str,
    weights: tuple[int, ...],
    dispatchers: int,
    live: bool,
    total: int,
    seed: int,
    root: Path = ROOT,
    group_total: int = GROUP_TOTAL,
    slots: int = GROUP_TOTAL,
) -> dict[str, Any]:
    rng = random.Random(seed)
    keys = new_keys()
    pools = [f"p{i}" for i in range(len(weights))]
    # In 4:1 the heavy pool gets two protected slots: fewer than its share of the group's slots, so they do
    # not bend the weights, but every claim checks them and every sample verifies them.
    heaviest = weights.index(max(weights)) if len(weights) == 2 else -1  # 1:1:2:4: cost mix bends it
    config = group(
        sim_url,
        [
            PoolConfig(p, quantum=4 * w, max_concurrent=group_total, min_concurrent=2 if i == heaviest else 0)
            for i, (p, w) in enumerate(zip(pools, weights, strict=True))
        ],
        total=group_total,
    )
    share = [w / sum(weights) for w in weights]
    costs = {
        p: [rng.randint(1, 4 if i % 2 == 0 else 16) for _ in range(total + 300)] for i, p in enumerate(pools)
    }
    async with client(valkey_url) as conn, Producer(conn, keys=keys, producer_id="fleet") as producer:
        for p in pools:
            await preload(conn, keys, p, producer.producer_id, costs[p])
        await publish(conn, keys, config)
        with fleet(valkey_url, keys.prefix, config.group_id, dispatchers, root, slots) as (per, procs):
            stop = asyncio.Event()
            calls0, cpu0 = await valkey_counters(conn)
            dcpu0 = sum(cpu_seconds(proc.pid) for proc in procs)
            started = time.perf_counter()
            sampler = asyncio.create_task(sample_caps(conn, keys, config, stop))
            pushed = dict.fromkeys(pools, 0)
            pusher = (
                asyncio.create_task(live_pushes(conn, keys, producer.producer_id, pushed, stop))
                if live
                else None
            )
            while True:
                async with conn.pipeline(transaction=False) as pipe:
                    for p in pools:
                        pipe.llen(keys.requests(p))
                    lengths = await pipe.execute()
                # Live pushes land behind the backlog: what left is the preloaded head side.
                left = [len(costs[p]) + pushed[p] - n for p, n in zip(pools, lengths, strict=True)]
                if sum(left) >= total:
                    break
                await asyncio.sleep(0.02)
            elapsed = time.perf_counter() - started
            calls1, cpu1 = await valkey_counters(conn)
            dcpu1 = sum(cpu_seconds(proc.pid) for proc in procs)
            stop.set()
            samples, violations = await sampler
            if pusher:
                await pusher
    dispatched = [sum(costs[p][:g]) for p, g in zip(pools, left, strict=True)]
    measured = [d / sum(dispatched) for d in dispatched]
    completions = sum(s["completed"] for s in per)
    done = max(1, sum(left))
    return {
        "requests": done,
        "rate": done / elapsed,
        "error_pp": max(abs(m - t) * 100 for m, t in zip(measured, share, strict=True)),
        "jain": jain([m / t for m, t in zip(measured, share, strict=True)]),
        "lost_per_completion": sum(s["claim_lost"] for s in per) / max(1, completions),
        "split_dev_pct": max(abs(s["completed"] / max(1, completions) * dispatchers - 1) * 100 for s in per),
        "split": [s["completed"] for s in per],
        "commands_per_completion": (calls1 - calls0) / done,
        "cpu_us_per_completion": (cpu1 - cpu0) * 1e6 / done,
        "dispatcher_us_per_completion": (dcpu1 - dcpu0) * 1e6 / done,
        "turn_busy_per_completion": sum(s["turn_busy"] for s in per) / max(1, completions),
        "rounds_per_completion": sum(s["rounds"] for s in per) / max(1, completions),
        "samples": samples,
        "violations": violations,
        "tokens_per_completion": sum(s["wake_tokens"] for s in per) / max(1, completions),
        # Round trips to Valkey of the rounds and of the FINISH batches (-1: a revision not counting them).
        "trips_per_completion": sum(s["round_trips"] + s["finish_trips"] for s in per) / max(1, completions)
        if all("finish_trips" in s for s in per)
        else -1,
        "finishes_per_trip": sum(s.get("finishes", 0) for s in per)
        / max(1, sum(s.get("finish_trips", 0) for s in per)),
        "backlogged": all(g < len(costs[p]) for p, g in zip(pools, left, strict=True)),
    }


Key = tuple[str, str, int, int, bool]  # (variant, scenario, dispatchers, slots each, live wake-ups)
AFTER = "after"


@dataclasses.dataclass(frozen=True)
class Slots:
    """The group total, each dispatcher's own concurrency, and that of the extra lone dispatcher."""

    total: int = GROUP_TOTAL
    each: int = GROUP_TOTAL
    lone: int | None = None  # --lone-slots: one more lone dispatcher, with this many slots

    def setups(self, fleets: tuple[int, ...]) -> list[tuple[int, int]]:
        """(dispatchers, slots each) to run: the fleets, then the lone dispatcher of ``lone`` slots."""
        extra = [(1, self.lone)] if self.lone is not None and self.lone != self.each else []
        return [(n, self.each) for n in fleets] + extra


async def measure(
    variants: dict[str, Path], fleets: tuple[int, ...], quick: bool, runs: int, slots: Slots = Slots()
) -> dict[Key, list[dict[str, Any]]]:
    total = 1500 if quick else 10_000
    results: dict[Key, list[dict[str, Any]]] = {}
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        for run in range(runs):
            for name, weights in SCENARIOS.items():
                for live in (False, True):
                    for n, each in slots.setups(fleets):
                        # Alternate which variant goes first, so neither always runs in the same slot.
                        order = list(variants.items())
                        for variant, root in order if run % 2 == 0 else order[::-1]:
                            r = await one_run(
                                valkey_url, sim_url, weights, n, live, total, seed=run, root=root,
                                group_total=slots.total, slots=each,
                            )  # fmt: skip
                            results.setdefault((variant, name, n, each, live), []).append(r)
                            print(
                                f"run {run} {variant} {name} n={n} slots={each} live={live}: {r}",
                                file=sys.stderr,
                                flush=True,
                            )
    return results


def held(slots: Slots, n: int, each: int) -> int:
    """The slots of the group each of ``n`` dispatchers of ``each`` local slots may hold."""
    return scheduler.fleet_share(slots.total, each, (each,) * n)


def report(
    results: dict[Key, list[dict[str, Any]]], runs: int, quick: bool, slots: Slots = Slots()
) -> list[dict[str, Any]]:
    def med(rs: list[dict[str, Any]], key: str) -> float:
        return median([r[key] for r in rs])

    rows, summary = [], []
    for (variant, name, n, each, live), rs in results.items():
        base = results[(variant, name, 1, slots.each, live)]
        ratio = med(rs, "commands_per_completion") / med(base, "commands_per_completion")
        cpu_ratio = med(rs, "dispatcher_us_per_completion") / med(base, "dispatcher_us_per_completion")
        rows.append(
            [
                variant,
                name,
                n,
                f"{each} ({held(slots, n, each)} of {slots.total})",
                "yes" if live else "no",
                f"{med(rs, 'error_pp'):.3f}",
                f"{med(rs, 'jain'):.6f}",
                f"{med(rs, 'lost_per_completion'):.3f}",
                f"{med(rs, 'split_dev_pct'):.1f}",
                f"{med(rs, 'rate'):.0f}",
                f"{med(rs, 'commands_per_completion'):.1f} ({ratio:.2f}x)",
                f"{med(rs, 'cpu_us_per_completion'):.0f}",
                f"{med(rs, 'dispatcher_us_per_completion'):.0f} ({cpu_ratio:.2f}x)",
                f"{med(rs, 'tokens_per_completion'):.2f}",
                f"{med(rs, 'trips_per_completion'):.2f} ({med(rs, 'finishes_per_trip'):.2f})",
                f"{med(rs, 'rounds_per_completion'):.2f}",
                f"{med(rs, 'turn_busy_per_completion'):.2f}",
                f"{sum(r['violations'] for r in rs)}/{sum(r['samples'] for r in rs)}",
                "yes" if all(r["backlogged"] for r in rs) else "NO",
            ]
        )
        keep = (
            "error_pp",
            "lost_per_completion",
            "split_dev_pct",
            "cpu_us_per_completion",
            "dispatcher_us_per_completion",
            "commands_per_completion",
            "rounds_per_completion",
        )
        summary.append({"variant": variant, "scenario": name, "dispatchers": n, "slots": each, "live": live,
            "ratio": ratio, "cpu_ratio": cpu_ratio, **{k: med(rs, k) for k in keep},
            "violations": sum(r["violations"] for r in rs)})  # fmt: skip
    print(f"# fleet: 1-3 dispatcher processes, median of {runs} runs{' (quick)' if quick else ''}")
    print(f"# group total {slots.total}, each dispatcher {slots.each} local slots; {machine()}")
    print(
        table(
            [
                "variant",
                "weights",
                "dispatchers",
                "local slots each (held)",
                "live wake-ups",
                "max error pp",
                "Jain",
                "lost claims/completion",
                "split dev % (max)",
                "req/s",
                "Valkey cmds/completion (vs 1)",
                "Valkey CPU us/completion",
                "dispatcher CPU us/completion (vs 1)",
                "wake tokens/completion",
                "Valkey trips/completion (finishes per FINISH trip)",
                "rounds/completion",
                "turn found taken/completion",
                "violations/samples",
                "backlogged",
            ],
            rows,
        )
    )
    three = [
        s
        for s in summary
        if s["variant"] == AFTER and s["dispatchers"] == 3 and s["slots"] == slots.each and s["live"]
    ]
    checks = {
        "fairness error <= 0.1 pp": all(s["error_pp"] <= 0.1 for s in three),
        "lost claims <= 0.1 per completion": all(s["lost_per_completion"] <= 0.1 for s in three),
        "work split within +-15 %": all(s["split_dev_pct"] <= 15 for s in three),
        "commands/completion <= 1-dispatcher + 10 %": all(s["ratio"] <= 1.1 for s in three),
        "dispatcher CPU/completion <= 1.3x 1-dispatcher": all(s["cpu_ratio"] <= 1.3 for s in three),
        "zero cap or protected-slot violations": all(s["violations"] == 0 for s in summary),
    }
    for check, ok in checks.items():
        print(f"target ({AFTER}, 3 dispatchers, live wake-ups): {check} ->", "met" if ok else "MISSED")
    cpu1 = [
        s["cpu_us_per_completion"]
        for s in summary
        if s["variant"] == AFTER and s["dispatchers"] == 1 and s["slots"] == slots.each
    ]
    if cpu1:
        print(f"estimate: one Valkey core carries ~{1e6 / median(cpu1):.0f} completions/s (1 dispatcher)")
    if slots.lone is not None:
        print_against_lone(summary, slots)
    return summary


def print_against_lone(summary: list[dict[str, Any]], slots: Slots) -> None:
    """Each fleet against the lone dispatcher of ``--lone-slots`` slots: is the fleet's extra cost
    batching from fewer slots per dispatcher, or coordination?"""
    same = ("variant", "scenario", "live")
    for s in summary:
        if s["dispatchers"] == 1 or s["slots"] != slots.each:
            continue
        lone = next(
            (
                x
                for x in summary
                if x["dispatchers"] == 1 and x["slots"] == slots.lone and all(x[k] == s[k] for k in same)
            ),
            None,
        )
        if lone is None:
            continue
        cpu = s["dispatcher_us_per_completion"] / lone["dispatcher_us_per_completion"]
        print(
            f"{s['variant']} {s['scenario']} live={s['live']}: n={s['dispatchers']} (holding"
            f" {held(slots, s['dispatchers'], s['slots'])} each) vs 1 dispatcher of {slots.lone} slots:"
            f" dispatcher CPU {cpu:.2f}x,"
            f" Valkey commands {s['commands_per_completion'] / lone['commands_per_completion']:.2f}x,"
            f" rounds/completion {lone['rounds_per_completion']:.2f} -> {s['rounds_per_completion']:.2f}"
        )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--before", help="git revision to compare against (exported with git archive)")
    parser.add_argument("--fleets", default=",".join(map(str, FLEETS)), help="dispatcher counts, e.g. 1,3")
    parser.add_argument("--group-total", type=int, default=GROUP_TOTAL, help="the group's total concurrency")
    parser.add_argument(
        "--slots", type=int, default=None, help="each dispatcher's own concurrency (default: the total)"
    )
    parser.add_argument(
        "--lone-slots", type=int, default=None, help="also run one dispatcher of this many slots"
    )
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    fleets = tuple(int(n) for n in args.fleets.split(","))
    if 1 not in fleets:
        parser.error("--fleets must include 1: every ratio is against one dispatcher")
    slots = Slots(args.group_total, args.slots or args.group_total, args.lone_slots)
    with contextlib.ExitStack() as stack:
        variants = (
            {f"before ({args.before})": stack.enter_context(exported(args.before))} if args.before else {}
        )
        variants[AFTER] = ROOT
        results = asyncio.run(measure(variants, fleets, args.quick, runs, slots))
    print(f"# load (uptime) after the run: {os.getloadavg()}")
    summary = report(results, runs, args.quick, slots)
    if args.before:
        before = next(iter(variants))
        same = ("scenario", "dispatchers", "slots", "live")
        for s in summary:
            if s["variant"] == AFTER and s["dispatchers"] > 1:
                b = next(x for x in summary if x["variant"] == before and all(x[k] == s[k] for k in same))
                print(
                    f"{s['scenario']} n={s['dispatchers']} live={s['live']}: n vs 1 dispatcher CPU"
                    f" {b['cpu_ratio']:.2f}x -> {s['cpu_ratio']:.2f}x, Valkey commands"
                    f" {b['ratio']:.2f}x -> {s['ratio']:.2f}x (before -> after)"
                )
    return summary


if __name__ == "__main__":
    main()
