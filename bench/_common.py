"""Shared plumbing of the benchmarks: a private Valkey, the simulator and dispatchers as processes.

Everything listens on 127.0.0.1 and lives under a ``/tmp/bench-*`` scratch directory that is removed
afterwards. Child processes are started with their own process group and stopped by pid; on Linux
they are also stopped (SIGTERM) when the benchmark's process dies, even killed outright.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402

from runtime.queue import groups  # noqa: E402
from runtime.queue.keys import KeySpace  # noqa: E402
from runtime.valkey import embedded  # noqa: E402
from runtime.valkey.client import connect  # noqa: E402
from runtime.wire.backendconfig import BackendConfig  # noqa: E402
from runtime.wire.contract import ChatCall, Envelope, Metadata  # noqa: E402
from runtime.wire.groupconfig import GroupConfig, PoolConfig  # noqa: E402

CALL = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}


def machine() -> str:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ram = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        ram = f"{kb / 1024 / 1024:.1f} GiB"
    return f"nproc={os.cpu_count()} cpu={cpu!r} ram={ram} python={platform.python_version()}"


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bench-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def exported(ref: str) -> Iterator[Path]:
    """The tree of git revision ``ref`` in a scratch directory (``git archive``)."""
    with scratch() as path:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(path)], input=archive.stdout, check=True)
        yield path


@contextlib.contextmanager
def private_valkey() -> Iterator[str]:
    """A fresh embedded Valkey of this benchmark's own; yields its URL."""
    with private_valkey_server() as server:
        yield server.url


@contextlib.contextmanager
def private_valkey_server() -> Iterator[embedded.EmbeddedValkey]:
    """A fresh embedded Valkey of this benchmark's own; yields the server (URL and pid)."""
    with scratch() as data_dir:
        server = embedded.start(data_dir)
        try:
            yield server
        finally:
            embedded.stop(data_dir)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def stops_with_this_process() -> Callable[[], None] | None:
    """For ``Popen(preexec_fn=...)``: the child is sent SIGTERM when this process is gone. A bench
    killed outright (SIGKILL, a lost session) otherwise left its dispatchers, simulators and producers
    running, an hour of a core in one case, under every later measurement (bench/RESULTS.md, issue 23
    session 11). ``start_new_session`` keeps them out of the bench's Ctrl-C; this keeps them from
    outliving it. The signal follows the thread that forks: benchmarks spawn from their main thread."""
    if _LIBC is None:
        return None
    prctl = _LIBC.prctl
    parent_pid = os.getpid()

    def set_up_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # gone between the fork and the prctl: the signal never comes
            os._exit(1)

    return set_up_child


def spawn(
    args: Sequence[str], *, env: dict[str, str] | None = None, root: Path = ROOT, wrapper: Sequence[str] = ()
) -> subprocess.Popen[str]:
    """``python *args`` importing the project from ``root`` (another checkout for before/after runs),
    run under ``wrapper`` if given (e.g. valgrind)."""
    return subprocess.Popen(
        [*wrapper, sys.executable, *args],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(root), **(env or {})},
        preexec_fn=stops_with_this_process(),
    )


def stop_proc(proc: subprocess.Popen[str], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


@contextlib.contextmanager
def simulator_proc(*extra: str) -> Iterator[str]:
    """``python -m simulator`` on a free port; yields its /v1 URL."""
    with simulator_process(*extra) as (url, _):
        yield url


@contextlib.contextmanager
def simulator_process(
    *extra: str, root: Path = ROOT, module: str = "simulator"
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``python -m <module>`` from ``root`` on a free port; yields its /v1 URL and the process."""
    port = embedded.free_port()
    proc = spawn(["-m", module, "--port", str(port), *extra], root=root)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"simulator did not start: {line!r}")
        yield f"http://127.0.0.1:{port}/v1", proc
    finally:
        stop_proc(proc)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    user, system, _ = cpu_split(pid)
    return user + system


def cpu_split(pid: int) -> tuple[float, float, int]:
    """User and system CPU seconds a process has used so far, and its voluntary context switches
    (each a sleep in the kernel: a loop turn that waited for I/O)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    switches = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            switches = int(line.split()[1])
    return int(fields[11]) / tick, int(fields[12]) / tick, switches


def oncpu_seconds(pid: int) -> float:
    """CPU seconds a process's live threads have run so far, to the nanosecond (``/proc/.../schedstat``;
    ``/proc/<pid>/stat`` counts in clock ticks, 10 ms here: too coarse for a few hundred calls of a
    tenth of a millisecond)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended since the listing
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each of a process's live threads so far, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended since the listing
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live descendants (a server that forks workers)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError):
            total += cpu_seconds(current)
        todo.extend(children.get(current, []))
    return total


@contextlib.contextmanager
def dispatcher_procs(
    url: str,
    prefix: str,
    group_id: str,
    count: int,
    concurrency: int,
    *,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` dispatcher processes of one group (python -m bench._dispatcher_proc); yields them.

    ``root``: the checkout they import (another revision for before/after runs)."""
    procs = [
        spawn(
            ["-m", "bench._dispatcher_proc", url, prefix, group_id, str(concurrency), f"d{i}"],
            env=env,
            root=root,
        )
        for i in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if "ready" not in line:
                raise RuntimeError(f"dispatcher did not start: {line!r}")
        yield procs
    finally:
        for proc in procs:
            stop_proc(proc)


def new_keys() -> KeySpace:
    return KeySpace(prefix=f"b{uuid.uuid4().hex[:8]}:")


def group(
    endpoint: str,
    pools: Sequence[PoolConfig],
    *,
    policy: str = "drr",
    total: int = 64,
    group_id: str = "bench",
) -> GroupConfig:
    return GroupConfig(
        group_id=group_id,
        policy=policy,
        total_concurrency=total,
        default_endpoint_url=endpoint,
        pools=tuple(pools),
        version=1,
    )


FAIR_TENANTS = 16  # the hot-path benchmarks' --fair: closed-loop worker i is tenant t<i mod 16>


def hot_path_group(
    sim_url: str, slots: int, *, backend_row: bool = False, fair: bool = False, bounded: bool = False
) -> GroupConfig:
    """The hot-path benchmarks' group: one FIFO pool of ``slots``, through a backend row (``backend_row``)
    or a bare endpoint URL, its tenants sharing it (``fair``: ``tenant_fairness`` ``tokens``) or not,
    with a ``max_queued`` it never reaches (``bounded``: every push admitted) or none."""
    pool = PoolConfig(
        "default", max_concurrent=slots, tenant_fairness="tokens" if fair else "off",
        max_queued=1_000_000 if bounded else None,
    )  # fmt: skip
    config = group(sim_url, [pool], policy="fifo", total=slots)
    return through_backend_row(config, sim_url, 4 * slots) if backend_row else config


def through_backend_row(config: GroupConfig, base_url: str, max_in_flight: int) -> GroupConfig:
    """``config`` with its pools' calls going through a backend row, as the demo's and the admin's do
    (kind vLLM: load gate, shared breaker, the fleet's scraper on the simulator's ``/metrics``), its
    gate set never to hold, so that only what a backend row costs each call shows."""
    backend = BackendConfig(
        "sim", base_url=base_url, kind="vllm", max_in_flight=max_in_flight, max_waiting=1_000_000,
        max_kv_cache_usage=1.0,
    )  # fmt: skip
    return dataclasses.replace(config, default_endpoint_url="", backend_id="sim", backends=(backend,))


@contextlib.asynccontextmanager
async def client(url: str) -> AsyncIterator[aioredis.Redis]:
    conn = connect(url)
    try:
        yield conn
    finally:
        await conn.aclose()


async def publish(conn: aioredis.Redis, keys: KeySpace, config: GroupConfig) -> None:
    await groups.publish(conn, keys, config)


async def preload(
    conn: aioredis.Redis,
    keys: KeySpace,
    pool_id: str,
    producer_id: str,
    costs: Sequence[int | None],
    *,
    call: dict[str, object] | None = None,
    deadline_s: float = 3600.0,
) -> None:
    """Pushes one envelope per cost straight into a pool's list, in pipelines of 1,000."""
    chat = ChatCall.from_openai(call or CALL)
    now = time.time()
    for start in range(0, len(costs), 1000):
        async with conn.pipeline(transaction=False) as pipe:
            for cost in costs[start : start + 1000]:
                env = Envelope(
                    request_id=uuid.uuid4().hex,
                    producer_id=producer_id,
                    pool_id=pool_id,
                    call=chat,
                    enqueued_at=now,
                    deadline=now + deadline_s,
                    metadata=Metadata(cost_units=cost),
                )
                pipe.rpush(keys.requests(pool_id), env.encode())
            await pipe.execute()


async def wait_for(predicate, timeout: float, interval: float = 0.02) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached in time")
        await asyncio.sleep(interval)


async def closed_loop(  # type: ignore[no-untyped-def]
    producer,
    pool_id: str,
    concurrency: int,
    total: int,
    *,
    finished: list[tuple[float, Any]] | None = None,
    tenants: int = 0,
) -> tuple[list[float], float]:
    """``concurrency`` workers submit back to back until ``total`` calls are done.

    Returns every call's latency (seconds) and the wall time of the whole load. ``finished``, when
    given, gets each call's (end time, ``perf_counter`` seconds; result) in the order they ended.
    With ``tenants``, worker i's calls are tenant ``t<i mod tenants>``'s (else untagged).
    """
    latencies: list[float] = []
    remaining = total

    async def worker(tagged: dict[str, str]) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            result = await producer.submit(CALL, pool_id=pool_id, timeout=120, **tagged)
            ended = time.perf_counter()
            latencies.append(ended - started)
            if finished is not None:
                finished.append((ended, result))

    started = time.perf_counter()
    async with asyncio.TaskGroup() as tasks:
        for i in range(min(concurrency, total)):
            tasks.create_task(worker({"tenant": f"t{i % tenants}"} if tenants else {}))
    return latencies, time.perf_counter() - started


CpuMeters = Callable[[], Coroutine[Any, Any, dict[str, float]]]


async def measured_load(  # type: ignore[no-untyped-def]
    producer, level: int, total: int, meters: CpuMeters, tenants: int = 0
) -> dict[str, float]:
    """``total`` closed-loop calls at ``level`` (``tenants``: as :func:`closed_loop`): p50/p99 ms,
    completions/s (``rate``) and, per CPU meter that ``meters()`` reads (CPU ms so far, by name), the
    CPU ms it spent per call."""
    before = await meters()
    latencies, wall = await closed_loop(producer, "default", level, total, tenants=tenants)
    after = await meters()
    ms = [x * 1000 for x in latencies]
    per_call = {name: (after[name] - before[name]) / total for name in after}
    return {"p50": pct(ms, 0.5), "p99": pct(ms, 0.99), "rate": total / wall, **per_call}


async def valkey_cpu_ms(conn: aioredis.Redis) -> float:
    """Valkey's own CPU time so far (user + sys, ``INFO cpu``), in ms."""
    info = await conn.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1000


def run_benchmark(
    description: str,
    measure: Callable[[bool, int], Coroutine[Any, Any, Any]],
    report: Callable[[Any, int, bool], Any],
    argv: list[str] | None,
    *,
    default_runs: int = 3,
) -> Any:
    """The shared command line of the measured benchmarks: ``--quick`` smoke mode and ``--runs N``."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else default_runs)
    return report(asyncio.run(measure(args.quick, runs)), runs, args.quick)
