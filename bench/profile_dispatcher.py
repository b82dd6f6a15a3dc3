"""Where one dispatcher process spends its CPU at a fixed workload: cProfile or callgrind.

Run: ``python bench/profile_dispatcher.py --level 16 --calls 3500 [--root DIR] [--profile OUT.prof]
[--backend-row] [--fair] [--slots N] [--latency-ms MS] [--valkey]``
or ``... --callgrind`` (the dispatcher under ``valgrind --tool=callgrind``; its instruction count
over the measured calls only, zeroed after the warm-up and dumped after the last call).

One private Valkey, one zero-latency simulator, one dispatcher (64 slots, FIFO group), this process
the producer (closed loop at ``--level``). ``--root`` runs another checkout's dispatcher (e.g. an
export of ``main``). The instruction count does not move with the machine's load, unlike CPU time:
it is the before/after figure of a hot-path change on a shared machine. ``--valkey`` also prints
Valkey's CPU and each command's calls and time per call over the measured calls (``INFO`` deltas).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    FAIR_TENANTS,
    ROOT,
    client,
    closed_loop,
    cpu_split,
    hot_path_group,
    new_keys,
    private_valkey,
    publish,
    scratch,
    simulator_proc,
    spawn,
    stop_proc,
    thread_cpu_seconds,
    valkey_cpu_ms,
)
from runtime.producer import Producer

SLOTS = 64


def dispatcher(
    url: str, prefix: str, group_id: str, root: Path, env: dict[str, str], wrapper: list[str], slots: int
) -> subprocess.Popen[str]:
    args = ["-m", "bench._dispatcher_proc", url, prefix, group_id, str(slots), "d0"]
    proc = spawn(args, env=env, root=root, wrapper=wrapper)
    assert proc.stdout is not None
    if "ready" not in proc.stdout.readline():
        raise RuntimeError("dispatcher did not start")
    return proc


def control(pid: int, action: str) -> None:
    """``callgrind_control``: zero the counters, or dump them, of the dispatcher under callgrind."""
    subprocess.run(["callgrind_control", action, str(pid)], check=True, capture_output=True)


def callgrind_total(path: Path) -> int:
    """The instructions of a callgrind dump (its ``summary:`` / ``totals:`` line)."""
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


async def valkey_usage(conn: aioredis.Redis) -> dict[str, tuple[int, float]]:
    """Each command's calls and microseconds so far (``INFO commandstats``; a script's own commands
    count under their names as well as in its ``evalsha``), and Valkey's CPU microseconds as ``cpu``."""
    usage = {
        name.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
        for name, v in (await conn.info("commandstats")).items()
    }
    usage["cpu"] = (0, await valkey_cpu_ms(conn) * 1000)
    return usage


def valkey_report(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]], calls: int
) -> str:
    """Valkey's CPU per call, and each command's calls and microseconds per call, most costly first.

    Why: at concurrency 1 the commands' own time is about a third of Valkey's CPU; the rest is its
    event loop, socket reads and writes and wake-ups, which only fewer trips cut (RESULTS, session 19)."""
    rows = []
    for name, (n, usec) in after.items():
        n0, usec0 = before.get(name, (0, 0.0))
        if name != "cpu" and n > n0:
            rows.append((usec - usec0, name, n - n0))
    cpu = (after["cpu"][1] - before["cpu"][1]) / calls
    lines = [
        f"Valkey CPU {cpu / 1000:.3f} ms/call; commands per call (calls, microseconds of Valkey's time):"
    ]
    lines += [
        f"  {name:<22} {n / calls:6.2f}  {usec / calls:7.2f} us"
        for usec, name, n in sorted(rows, reverse=True)
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    root = Path(args.root).resolve() if args.root else ROOT
    latency = ("--latency-ms", str(args.latency_ms)) if args.latency_ms else ()
    with private_valkey() as url, simulator_proc(*latency) as sim_url, scratch() as tmp:
        keys = new_keys()
        config = hot_path_group(sim_url, args.slots, backend_row=args.backend_row, fair=args.fair)
        tenants = FAIR_TENANTS if args.fair else 0
        stats_path = tmp / "stats.json"
        env: dict[str, str] = {"BENCH_STATS": str(stats_path)}
        wrapper: list[str] = []
        if args.profile:
            env["BENCH_PROFILE"] = str(Path(args.profile).resolve())
        if args.tracing:
            env["BENCH_TRACING"] = "1"
        if args.callgrind:
            out = tmp / "callgrind.out"
            wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", "--dump-instr=no"]
            # A dispatcher 50x slower under valgrind must not lose its leases.
            env["BENCH_LEASE_S"] = "120"
        async with client(url) as conn:
            await publish(conn, keys, config)
            proc = dispatcher(url, keys.prefix, config.group_id, root, env, wrapper, args.slots)
            try:
                async with Producer(conn, keys=keys) as producer:
                    await closed_loop(producer, "default", args.level, args.warmup, tenants=tenants)
                    if args.callgrind:
                        control(proc.pid, "--zero")
                    before, threads_before = cpu_split(proc.pid), thread_cpu_seconds(proc.pid)
                    valkey_before = await valkey_usage(conn) if args.valkey else None
                    _, wall = await closed_loop(producer, "default", args.level, args.calls, tenants=tenants)
                    user, system, switches = (
                        (b - a) / args.calls for a, b in zip(before, cpu_split(proc.pid), strict=True)
                    )
                    # The main thread (the event loop) has the process's id; the others are the span
                    # export's and the SDK's (with --tracing).
                    threads = {
                        tid: (t - threads_before.get(tid, 0.0)) / args.calls
                        for tid, t in thread_cpu_seconds(proc.pid).items()
                    }
                    if args.callgrind:
                        control(proc.pid, "--dump")
                    valkey_after = await valkey_usage(conn) if args.valkey else None
            finally:
                stop_proc(proc, timeout=120)
        line = (
            f"level {args.level}: {args.calls} calls in {wall:.1f} s, dispatcher CPU"
            f" {(user + system) * 1000:.3f} ms/call (user {user * 1000:.3f}, system {system * 1000:.3f};"
            f" {switches:.2f} voluntary context switches/call)"
        )
        others = sum(ms for tid, ms in threads.items() if tid != proc.pid)
        if others:
            line += f", of which threads besides the event loop's {others * 1000:.3f} ms/call"
        if args.callgrind:
            dumps = sorted(tmp.glob("callgrind.out.*.1"))
            total = callgrind_total(dumps[0])
            if args.keep:
                shutil.copy(dumps[0], args.keep)
            line += f", {total / args.calls / 1e6:.3f} M instructions/call ({total} over the measured calls)"
        if stats_path.exists():  # whole run, warm-up included: rounds, round trips and FINISH trips per call
            stats = json.loads(stats_path.read_text())
            calls = max(1, stats["completed"])
            line += (
                f"; per call over the whole run: {stats['rounds'] / calls:.2f} rounds,"
                f" {stats['round_trips'] / calls:.2f} round trips"
                f" (+{max(0, stats.get('backend_reads', 0)) / calls:.2f} for backend readings alone),"
                f" {stats['wake_tokens'] / calls:.2f} wake tokens"
                f" ({stats.get('stale_tokens', 0) / calls:.3f} stale),"
                f" {stats['finish_trips'] / calls:.2f} FINISH trips"
                f" ({stats['finishes'] / max(1, stats['finish_trips']):.1f} finishes each)"
            )
        print(line, flush=True)
        if valkey_before is not None and valkey_after is not None:
            print(valkey_report(valkey_before, valkey_after, args.calls), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--level", type=int, default=16)
    parser.add_argument("--calls", type=int, default=3500)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--root", help="the checkout whose dispatcher runs (default: this one)")
    parser.add_argument("--profile", help="write a cProfile (CPU time) of the dispatcher's run here")
    parser.add_argument("--callgrind", action="store_true", help="count the dispatcher's instructions")
    parser.add_argument("--keep", help="with --callgrind: keep the dump here")
    parser.add_argument("--backend-row", action="store_true", help="the pool's calls through a backend row")
    parser.add_argument("--slots", type=int, default=SLOTS, help="the group's and the dispatcher's slots")
    parser.add_argument("--latency-ms", type=float, default=0, help="the simulator's latency per call")
    parser.add_argument("--fair", action="store_true", help="the pool's tenants share it (tenant_fairness)")
    parser.add_argument("--valkey", action="store_true", help="Valkey's CPU and commands per call")
    parser.add_argument(
        "--tracing", action="store_true", help="spans exported to Valkey for history, as rundispatcher does"
    )
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
