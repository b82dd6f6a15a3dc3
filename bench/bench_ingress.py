"""Added latency of the OpenAI-compatible ingress over calling the simulator directly, complete and streamed.

Run: ``python bench/bench_ingress.py [--quick] [--runs N] [--server daphne|uvicorn|both] [--before REF]``.

Processes: the simulator (latency 0), one dispatcher (``bench._dispatcher_proc``) and the ingress
servers asked for, each one process over the same SQLite and producer key: daphne serving
``dispatch_project.asgi`` (the web process) and ``manage.py runingress`` (uvicorn, uvloop, httptools).
This process is the client: it posts the same body either to the simulator (direct, the baseline) or
to an ingress with a producer key (``/v1/chat/completions`` -> Valkey -> dispatcher -> simulator ->
back). Each run measures every path, interleaved (the order rotates).

The client is an aiohttp session opened fresh for each path, figure and run, with as many connections
as the figure's concurrency, warmed before it is timed; direct and every ingress get the same kind.
One ``httpx.AsyncClient`` kept for the whole bench used to be the client, and after the loops at 16
and 64 its pool held 64 connections whose scan cost ~2 ms of CPU per call at concurrency 1, more than
the ingress hop being measured (RESULTS.md, issue 23 session 11); aiohttp costs ~0.2 ms per call.

* complete calls: closed loop at concurrency 1 and 16, p50/p99 per path; added = ingress - direct;
* throughput of one ingress process: calls/s of the closed loops at concurrency 16 and 64, against
  direct;
* streaming (concurrency 1, 20 tokens 5 ms apart from the simulator): time to first chunk, gaps
  between chunks, and the added delay per chunk ((added time to the last chunk - added time to the first)
  / chunks);
* complete calls after an idle pause (concurrency 1, ``IDLE_S`` of nothing before each call, about the
  idle time a stream leaves): the like-for-like reference for the time to first chunk, which follows a
  stream's idle gaps and so runs every process on the path cold (RESULTS.md, issue 23 session 6).
The table shows the median over runs of each figure.

A path ``queued`` makes the same calls through a :class:`~runtime.producer.Producer` in this process
(the queued path without an ingress: Valkey -> the same dispatcher -> simulator), so the report splits
the ingress's added time into queued-added (queued - direct: the queue, the dispatcher and their hops)
and ingress-added (ingress - queued: what the web process itself adds).

``--before REF`` adds a third ingress, ``before``: ``manage.py runingress`` of git revision ``REF``
exported with ``git archive``, over the same SQLite, key, Valkey, dispatcher and simulator, measured
in the same rotation; the report then gives uvicorn (this checkout) against it, run by run. The
client is this process's, so both trees are measured with the same one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import httpx
import orjson

from bench._common import (
    ROOT,
    client,
    cpu_seconds,
    dispatcher_procs,
    exported,
    group,
    machine,
    median,
    new_keys,
    pct,
    private_valkey,
    publish,
    scratch,
    simulator_proc,
    stop_proc,
    stops_with_this_process,
    table,
)
from bench._common import closed_loop as producer_closed_loop
from runtime.producer import Producer
from runtime.valkey.client import connect
from runtime.valkey.embedded import free_port
from runtime.wire.groupconfig import PoolConfig

SLOTS = 64
TOKENS, ITL_MS = 20, 5
BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
STREAM_BODY = {
    **BODY,
    "stream": True,
    "max_tokens": TOKENS,
    "sim": {"itl_ms": ITL_MS, "completion_tokens": TOKENS},
}
SERVERS = ("daphne", "uvicorn")
BEFORE = "before"  # uvicorn (runingress) of the --before revision
QUEUED = "queued"  # a Producer in this process: the queued path without an ingress
IDLE_S = 0.1
# Issue 23's targets: added ms at concurrency 1 (at most), and one process against direct at 16 (at least).
TARGETS_MS = {"complete_p50": 1.0, "ttft_p50": 1.5, "per_chunk": 0.5}
TARGET_RATE_16 = 0.8
MAKE_KEY = (
    "from ingress import services; "
    "print(services.producer_key_create(name='bench', pools=['default']).raw_key)"
)


def server_argv(server: str, port: int) -> list[str]:
    if server == "daphne":
        return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                "dispatch_project.asgi:application"]  # fmt: skip
    return [sys.executable, "manage.py", "runingress", "--host", "127.0.0.1", "--port", str(port)]


@contextmanager
def ingress_procs(
    valkey_url: str, prefix: str, servers: tuple[str, ...], before_root: Path | None = None
) -> Iterator[dict[str, tuple[str, str, int]]]:
    """The servers over one fresh SQLite with one producer key; {server: (url, key, pid)}.

    ``before_root``: a server ``before`` too, ``runingress`` of that tree (another revision)."""
    with scratch() as data_dir:
        env = {
            "DJANGO_SETTINGS_MODULE": "dispatch_project.settings",
            "DISPATCH_DATA_DIR": str(data_dir),
            "VALKEY_URL": valkey_url,
            "DISPATCH_KEY_PREFIX": prefix,
            "DJANGO_DEBUG": "false",
            "DJANGO_SECRET_KEY": "bench",
            "DISPATCH_LOG_LEVEL": "WARNING",
        }
        run_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=run_env, check=True)
        made = subprocess.run(
            [*manage, "shell", "-c", MAKE_KEY],
            cwd=ROOT,
            env=run_env,
            check=True,
            capture_output=True,
            text=True,
        )
        key = made.stdout.strip().splitlines()[-1]
        procs: list[subprocess.Popen[str]] = []
        found: dict[str, tuple[str, str, int]] = {}
        try:
            roots = [(server, server, ROOT) for server in servers]
            if before_root is not None:
                roots.append((BEFORE, "uvicorn", before_root))
            for server, kind, root in roots:
                port = free_port()
                # Its access log goes nowhere: an unread pipe would fill up and stall the server.
                proc = subprocess.Popen(
                    server_argv(kind, port), cwd=root, env={**run_env, "PYTHONPATH": str(root)},
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                    preexec_fn=stops_with_this_process(),
                )  # fmt: skip
                procs.append(proc)
                wait_up(port, proc, server)
                found[server] = (f"http://127.0.0.1:{port}/v1", key, proc.pid)
            yield found
        finally:
            for proc in procs:
                stop_proc(proc)


def wait_up(port: int, proc: subprocess.Popen[str], server: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{server} did not start") from None
            time.sleep(0.1)


CLIENT = (
    f"aiohttp {aiohttp.__version__}, a fresh session per path, figure and run with as many connections "
    "as the concurrency, warmed (direct and every ingress alike); queued: a Producer in this process"
)


@asynccontextmanager
async def http_session(concurrency: int) -> AsyncIterator[aiohttp.ClientSession]:
    """A fresh aiohttp session of ``concurrency`` connections, the client of one path for one figure.

    Sized to the figure so that no pool grown by an earlier, wider loop is carried into a narrower one."""
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


async def closed_loop(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], concurrency: int, total: int
) -> tuple[list[float], float]:
    """Latencies (s) of ``total`` calls made by ``concurrency`` back-to-back workers, and the wall time."""
    content = orjson.dumps(BODY)
    headers = {"content-type": "application/json", **headers}
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            async with http.post(f"{url}/chat/completions", data=content, headers=headers) as response:
                reply = await response.read()
            latencies.append(time.perf_counter() - started)
            assert response.status == 200, reply

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


async def stream_once(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> list[float]:
    """Arrival times (s after sending) of each SSE data event of one streamed call, [DONE] excluded."""
    arrivals: list[float] = []
    headers = {"content-type": "application/json", **headers}
    started = time.perf_counter()
    async with http.post(f"{url}/chat/completions", data=orjson.dumps(STREAM_BODY), headers=headers) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.rstrip(b"\r\n")
            if line.startswith(b"data:") and line != b"data: [DONE]":
                arrivals.append(time.perf_counter() - started)
    return arrivals


async def producer_stream_once(producer: Producer) -> list[float]:
    """``stream_once`` through ``producer`` in this process: arrival times (s) of each chunk."""
    arrivals: list[float] = []
    started = time.perf_counter()
    async for _chunk in producer.stream(STREAM_BODY, pool_id="default", timeout=60):
        arrivals.append(time.perf_counter() - started)
    return arrivals


def calls(level: int, quick: bool) -> int:
    return {1: 100, 16: 320, SLOTS: 640}[level] if quick else {1: 400, 16: 1600, SLOTS: 3200}[level]


def rotated(items: list[Any], run: int) -> list[Any]:
    shift = run % len(items)
    return items[shift:] + items[:shift]


class Caller:
    """One path's calls through one client: ``http`` (an aiohttp session) for direct and the ingresses,
    or ``producer`` in this process for ``queued`` (``http`` None)."""

    def __init__(
        self, producer: Producer, http: aiohttp.ClientSession | None, url: str, headers: dict[str, str]
    ) -> None:
        self.producer = producer
        self.http = http
        self.url = url
        self.headers = headers

    async def loop(self, concurrency: int, total: int) -> tuple[list[float], float]:
        if self.http is None:
            return await producer_closed_loop(self.producer, "default", concurrency, total)
        return await closed_loop(self.http, self.url, self.headers, concurrency, total)

    async def streamed(self) -> list[float]:
        if self.http is None:
            return await producer_stream_once(self.producer)
        return await stream_once(self.http, self.url, self.headers)


class Paths:
    """Every path a run measures, by name: direct and the ingresses over HTTP (``http_paths``), and
    ``queued`` through ``producer`` in this process. ``pid``: the process whose CPU per call is counted,
    or 0."""

    def __init__(self, producer: Producer, http_paths: dict[str, tuple[str, dict[str, str], int]]) -> None:
        self.producer = producer
        self.http_paths = http_paths
        self.names = [*http_paths, QUEUED]

    def pid(self, name: str) -> int:
        return self.http_paths[name][2] if name in self.http_paths else 0

    @asynccontextmanager
    async def caller(self, name: str, concurrency: int) -> AsyncIterator[Caller]:
        """``name``'s caller with a client of its own for ``concurrency`` workers, warmed: each of its
        connections open and every process on the path just used."""
        if name == QUEUED:
            caller = Caller(self.producer, None, "", {})
            await caller.loop(concurrency, 2 * concurrency)
            yield caller
            return
        url, headers, _ = self.http_paths[name]
        async with http_session(concurrency) as http:
            caller = Caller(self.producer, http, url, headers)
            await caller.loop(concurrency, 2 * concurrency)
            yield caller


async def measure(
    quick: bool, runs: int, servers: tuple[str, ...], before_root: Path | None = None
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        keys = new_keys()
        config = group(sim_url, [PoolConfig("default", max_concurrent=SLOTS)], policy="fifo", total=SLOTS)
        async with client(valkey_url) as conn:
            await publish(conn, keys, config)
        with (
            dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, SLOTS),
            ingress_procs(valkey_url, keys.prefix, servers, before_root) as ingresses,
        ):
            http_paths: dict[str, tuple[str, dict[str, str], int]] = {"direct": (sim_url, {}, 0)} | {
                name: (url, {"authorization": f"Bearer {key}"}, pid)
                for name, (url, key, pid) in ingresses.items()
            }
            async with Producer(connect(valkey_url), keys=keys, producer_id="bench-queued") as producer:
                paths = Paths(producer, http_paths)
                for name in paths.names:  # warm the key cache, the producers, the dispatcher
                    async with paths.caller(name, 16) as caller:
                        await caller.loop(16, 200)
                for run in range(runs):
                    await one_run(paths, rotated(paths.names, run), quick, out)
    return out


async def one_run(paths: Paths, order: list[str], quick: bool, out: dict[str, list[float]]) -> None:
    """Every figure of every path once, the paths in ``order``, noted into ``out``."""

    def note(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    streams = 5 if quick else 60  # quick: a smoke run, every figure once end to end
    for level in (1, 16, SLOTS):
        for name in order:
            async with paths.caller(name, level) as caller:
                pid = paths.pid(name)
                cpu_before = cpu_seconds(pid) if pid else 0.0
                # This process is every path's client (aiohttp, or the producer for ``queued``).
                client_before = time.process_time()
                lat, wall = await caller.loop(level, calls(level, quick))
                client_ms = (time.process_time() - client_before) * 1000 / len(lat)
            note(f"{name}:client_cpu_ms:{level}", client_ms)
            if pid:
                note(f"{name}:cpu_ms:{level}", (cpu_seconds(pid) - cpu_before) * 1000 / len(lat))
            ms = [x * 1000 for x in lat]
            note(f"{name}:{level}:p50", pct(ms, 0.5))
            note(f"{name}:{level}:p99", pct(ms, 0.99))
            note(f"{name}:{level}:rate", len(lat) / wall)
    for name in order:
        ttft, gaps, last = [], [], []
        async with paths.caller(name, 1) as caller:
            for _ in range(streams):
                arrivals = await caller.streamed()
                ttft.append(arrivals[0] * 1000)
                last.append(arrivals[-1] * 1000)
                gaps += [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]
                note(f"{name}:chunks", len(arrivals))
        for label, values in (("ttft", ttft), ("gap", gaps), ("last", last)):
            note(f"{name}:{label}:p50", pct(values, 0.5))
            note(f"{name}:{label}:p99", pct(values, 0.99))
    for name in order:
        idle = []
        async with paths.caller(name, 1) as caller:
            for _ in range(streams):
                await asyncio.sleep(IDLE_S)
                lat, _wall = await caller.loop(1, 1)
                idle.append(lat[0] * 1000)
        note(f"{name}:idle:p50", pct(idle, 0.5))
        note(f"{name}:idle:p99", pct(idle, 0.99))


def added(out: dict[str, list[float]], server: str, figure: str, base: str = "direct") -> float:
    """Median over runs of (server - base) for one figure, each difference taken within its run."""
    pairs = zip(out[f"{server}:{figure}"], out[f"{base}:{figure}"], strict=True)
    return median([i - d for i, d in pairs])


def rate_ratio(out: dict[str, list[float]], server: str, level: int | str, base: str = "direct") -> float:
    """Median over runs of the same-run ratio server / base of one figure (calls per second)."""
    figure = f"{level}:rate" if isinstance(level, int) else level
    pairs = zip(out[f"{server}:{figure}"], out[f"{base}:{figure}"], strict=True)
    return median([i / d for i, d in pairs])


FIGURES = (
    ("1", "complete, concurrency 1"),
    ("16", "complete, concurrency 16"),
    ("ttft", "stream: time to first chunk"),
    ("gap", "stream: gap between chunks"),
    ("idle", f"complete after {IDLE_S * 1000:.0f} ms idle"),
)


def report(out: dict[str, list[float]], runs: int, quick: bool) -> dict[str, float]:
    m = {k: median(v) for k, v in out.items()}
    servers = [s for s in (*SERVERS, BEFORE) if f"{s}:1:p50" in out]
    mode = " (quick)" if quick else ""
    print(f"# ingress vs direct, zero-latency simulator, median of {runs} runs{mode}")
    print(f"# {machine()}")
    print(f"# client: {CLIENT}")
    columns = [s for s in (QUEUED, *servers) if f"{s}:1:p50" in out]
    rows = []
    for figure, what in FIGURES:
        row = [what, f"{m[f'direct:{figure}:p50']:.2f} / {m[f'direct:{figure}:p99']:.2f}"]
        for server in columns:
            row.append(
                f"{m[f'{server}:{figure}:p50']:.2f} / {m[f'{server}:{figure}:p99']:.2f} "
                f"({added(out, server, f'{figure}:p50'):+.2f} / {added(out, server, f'{figure}:p99'):+.2f})"
            )
        rows.append(row)
    headers = ["figure", "direct p50/p99 ms", *(f"{s} p50/p99 ms (added)" for s in columns)]
    print(table(headers, rows))
    summary: dict[str, float] = {}
    if QUEUED in columns:
        summary |= ingress_share(out, servers)
    for server in servers:
        chunks = m[f"{server}:chunks"]
        per_chunk = (added(out, server, "last:p50") - added(out, server, "ttft:p50")) / max(1.0, chunks - 1)
        rates = ", ".join(
            f"at {level}: {m[f'{server}:{level}:rate']:.0f} vs direct "
            f"{m[f'direct:{level}:rate']:.0f} calls/s = {rate_ratio(out, server, level):.2f}x"
            for level in (16, SLOTS)
        )
        cpu = ", ".join(f"{m[f'{server}:cpu_ms:{level}']:.2f} ms at {level}" for level in (1, 16, SLOTS))
        print(f"{server}: one process {rates}")
        # On this 2-core machine every process of both paths shares the cores; with a core of its own,
        # one ingress process could carry 1000 / (its CPU ms per call) calls/s.
        capacity = 1000 / m[f"{server}:cpu_ms:16"]
        print(f"{server}: one process with a core of its own: {capacity:.0f} calls/s at 16 "
              f"= {capacity / m['direct:16:rate']:.2f}x this run's direct rate")  # fmt: skip
        print(f"{server}: CPU per call (load-independent): {cpu}; {chunks:.0f} chunks per stream, "
              f"added per chunk (p50) {per_chunk:+.3f} ms")  # fmt: skip
        figures = {
            "complete_p50": added(out, server, "1:p50"),
            "ttft_p50": added(out, server, "ttft:p50"),
            "per_chunk": per_chunk,
        }
        for name, target in TARGETS_MS.items():
            print(f"{server}: target {name} <= {target} ms at concurrency 1: {figures[name]:+.2f} ms ->",
                  "met" if figures[name] <= target else "MISSED")  # fmt: skip
        ratio = rate_ratio(out, server, 16)
        print(f"{server}: target one process >= {TARGET_RATE_16}x direct at 16: {ratio:.2f}x ->",
              "met" if ratio >= TARGET_RATE_16 else "MISSED")  # fmt: skip
        summary |= {f"{server}:{name}": value for name, value in figures.items()}
        summary[f"{server}:rate16_ratio"] = ratio
    if BEFORE in servers and "uvicorn" in servers:
        summary |= against_before(out)
    return summary


SPLIT = (
    ("1:p50", "complete c1 p50"),
    ("ttft:p50", "first chunk p50"),
    ("idle:p50", "complete after idle p50"),
)


def ingress_share(out: dict[str, list[float]], servers: list[str]) -> dict[str, float]:
    """The added time split at the queue: queued-added (queued - direct) is the queue, the dispatcher
    and their hops; ingress-added (ingress - queued) is what the web process adds on top."""
    queued = {label: added(out, QUEUED, figure) for figure, label in SPLIT}
    rate = rate_ratio(out, QUEUED, 16)
    print(f"{QUEUED} (producer in this process, no ingress): queued-added (queued - direct) "
          + ", ".join(f"{label} {value:+.2f} ms" for label, value in queued.items())
          + f"; at 16: {rate:.2f}x direct")  # fmt: skip
    summary = {f"{QUEUED}:{label}": value for label, value in queued.items()}
    m = {k: median(v) for k, v in out.items()}
    print("client CPU per call (this process: aiohttp, or the producer for queued), at 1 / 16: "
          + ", ".join(f"{name} {m[f'{name}:client_cpu_ms:1']:.2f} / {m[f'{name}:client_cpu_ms:16']:.2f} ms"
                      for name in ("direct", QUEUED, *servers)))  # fmt: skip
    for server in servers:
        share = {label: added(out, server, figure, QUEUED) for figure, label in SPLIT}
        print(f"{server}: ingress-added ({server} - queued) "
              + ", ".join(f"{label} {value:+.2f} ms" for label, value in share.items())
              + f"; at 16: {rate_ratio(out, server, 16, QUEUED):.2f}x queued")  # fmt: skip
        summary |= {f"{server}:ingress_added:{label}": value for label, value in share.items()}
    return summary


def against_before(out: dict[str, list[float]]) -> dict[str, float]:
    """uvicorn (this checkout) against ``before`` (the --before revision), each figure within its run."""
    lines = {
        "complete c1 p50 ms": added(out, "uvicorn", "1:p50", BEFORE),
        "first chunk p50 ms": added(out, "uvicorn", "ttft:p50", BEFORE),
        "first chunk p99 ms": added(out, "uvicorn", "ttft:p99", BEFORE),
        "complete after idle p50 ms": added(out, "uvicorn", "idle:p50", BEFORE),
    }
    for label, value in lines.items():
        print(f"after - before: {label} {value:+.3f}")
    ratios = {f"calls/s at {level}": rate_ratio(out, "uvicorn", level, BEFORE) for level in (16, SLOTS)}
    ratios |= {f"CPU per call at {lv}": rate_ratio(out, "uvicorn", f"cpu_ms:{lv}", BEFORE) for lv in (1, 16)}
    for label, value in ratios.items():
        print(f"after / before: {label} {value:.3f}x")
    return {f"after_vs_before:{label}": value for label, value in (lines | ratios).items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--runs", type=int, default=None, help="default: 1 with --quick, else 3")
    parser.add_argument("--server", choices=[*SERVERS, "both"], default="both", help="ingress server(s)")
    parser.add_argument("--before", help="git revision whose runingress joins the run (git archive)")
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    servers = SERVERS if args.server == "both" else (args.server,)
    with contextlib.ExitStack() as stack:
        before_root = stack.enter_context(exported(args.before)) if args.before else None
        out = asyncio.run(measure(args.quick, runs, servers, before_root))
    return report(out, runs, args.quick)


if __name__ == "__main__":
    main()
