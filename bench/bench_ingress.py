"""Added latency of the OpenAI-compatible ingress over calling the simulator directly, complete and streamed.

Run: ``python bench/bench_ingress.py [--quick] [--runs N]``.

Processes: the simulator (latency 0), one dispatcher (``bench._dispatcher_proc``) and one daphne web
process serving ``dispatch_project.asgi`` (the ingress). This process is the client: the same
``httpx.AsyncClient`` posts the same body either to the simulator (direct, the baseline) or to the
ingress with a producer key (``/v1/chat/completions`` -> Valkey -> dispatcher -> simulator -> back).
Each run measures both paths, interleaved (alternating which goes first).

* complete calls: closed loop at concurrency 1 and 16, p50/p99 per path; added = ingress - direct;
* throughput of one web process: closed loop at concurrency 64, calls/s, against direct;
* streaming (concurrency 1, 20 tokens 5 ms apart from the simulator): time to first chunk, gaps
  between chunks, and the added delay per chunk ((added time to the last chunk - added time to the first)
  / chunks).
The table shows the median over runs of each figure.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import orjson

from bench._common import (
    ROOT,
    client,
    cpu_seconds,
    dispatcher_procs,
    group,
    machine,
    median,
    new_keys,
    pct,
    private_valkey,
    publish,
    run_benchmark,
    scratch,
    simulator_proc,
    stop_proc,
    table,
)
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
TARGETS_MS = {"complete_p50": 3.0, "ttft_p50": 3.0, "per_chunk": 0.5}
MAKE_KEY = (
    "from ingress import services; "
    "print(services.producer_key_create(name='bench', pools=['default']).raw_key)"
)


@contextmanager
def ingress_proc(valkey_url: str, prefix: str) -> Iterator[tuple[str, str, int]]:
    """daphne serving the project's ASGI app, with a fresh SQLite and one producer key; (url, key, pid)."""
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
        port = free_port()
        # Its access log goes nowhere: an unread pipe would fill up and stall the server.
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "dispatch_project.asgi:application"],
            cwd=ROOT, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("daphne did not start") from None
                    time.sleep(0.1)
            yield f"http://127.0.0.1:{port}/v1", key, proc.pid
        finally:
            stop_proc(proc)


async def closed_loop(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], concurrency: int, total: int
):  # type: ignore[no-untyped-def]
    """Latencies (s) of ``total`` calls made by ``concurrency`` back-to-back workers, and the wall time."""
    content = orjson.dumps(BODY)
    latencies: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            response = await http.post(f"{url}/chat/completions", content=content, headers=headers)
            latencies.append(time.perf_counter() - started)
            assert response.status_code == 200, response.text

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


async def stream_once(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> list[float]:
    """Arrival times (s after sending) of each SSE data event of one streamed call, [DONE] excluded."""
    arrivals: list[float] = []
    started = time.perf_counter()
    async with http.stream(
        "POST", f"{url}/chat/completions", content=orjson.dumps(STREAM_BODY), headers=headers
    ) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                arrivals.append(time.perf_counter() - started)
    return arrivals


def calls(level: int, quick: bool) -> int:
    return {1: 100, 16: 320, SLOTS: 640}[level] if quick else {1: 400, 16: 1600, SLOTS: 3200}[level]


async def measure(quick: bool, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}

    def note(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    streams = 20 if quick else 60
    with private_valkey() as valkey_url, simulator_proc() as sim_url:
        keys = new_keys()
        config = group(sim_url, [PoolConfig("default", max_concurrent=SLOTS)], policy="fifo", total=SLOTS)
        async with client(valkey_url) as conn:
            await publish(conn, keys, config)
        with (
            dispatcher_procs(valkey_url, keys.prefix, config.group_id, 1, SLOTS),
            ingress_proc(valkey_url, keys.prefix) as (ingress_url, key, web_pid),
        ):
            paths = {"direct": (sim_url, {}), "ingress": (ingress_url, {"authorization": f"Bearer {key}"})}
            limits = httpx.Limits(max_connections=SLOTS, max_keepalive_connections=SLOTS)
            async with httpx.AsyncClient(limits=limits, timeout=60) as http:
                for url, headers in paths.values():  # warm connections, the key cache, the producer
                    await closed_loop(http, url, headers, 16, 200)
                for run in range(runs):
                    order = list(paths.items()) if run % 2 == 0 else list(paths.items())[::-1]
                    for level in (1, 16, SLOTS):
                        for name, (url, headers) in order:
                            cpu_before = cpu_seconds(web_pid)
                            lat, wall = await closed_loop(http, url, headers, level, calls(level, quick))
                            if name == "ingress":
                                note(
                                    f"web_cpu_ms:{level}",
                                    (cpu_seconds(web_pid) - cpu_before) * 1000 / len(lat),
                                )
                            ms = [x * 1000 for x in lat]
                            note(f"{name}:{level}:p50", pct(ms, 0.5))
                            note(f"{name}:{level}:p99", pct(ms, 0.99))
                            note(f"{name}:{level}:rate", len(lat) / wall)
                    for name, (url, headers) in order:
                        ttft, gaps, last = [], [], []
                        for _ in range(streams):
                            arrivals = await stream_once(http, url, headers)
                            ttft.append(arrivals[0] * 1000)
                            last.append(arrivals[-1] * 1000)
                            gaps += [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]
                            note(f"{name}:chunks", len(arrivals))
                        for label, values in (("ttft", ttft), ("gap", gaps), ("last", last)):
                            note(f"{name}:{label}:p50", pct(values, 0.5))
                            note(f"{name}:{label}:p99", pct(values, 0.99))
    return out


def added(out: dict[str, list[float]], figure: str) -> float:
    """Median over runs of (ingress - direct) for one figure."""
    return median([i - d for i, d in zip(out[f"ingress:{figure}"], out[f"direct:{figure}"], strict=True)])


def report(out: dict[str, list[float]], runs: int, quick: bool) -> dict[str, float]:
    m = {k: median(v) for k, v in out.items()}
    mode = " (quick)" if quick else ""
    print(f"# ingress vs direct, zero-latency simulator, median of {runs} runs{mode}")
    print(f"# {machine()}")
    rows = []
    for level in (1, 16):
        rows.append(
            [
                f"complete, concurrency {level}",
                f"{m[f'direct:{level}:p50']:.2f} / {m[f'direct:{level}:p99']:.2f}",
                f"{m[f'ingress:{level}:p50']:.2f} / {m[f'ingress:{level}:p99']:.2f}",
                f"{added(out, f'{level}:p50'):+.2f} / {added(out, f'{level}:p99'):+.2f}",
            ]
        )
    for label, what in (("ttft", "stream: time to first chunk"), ("gap", "stream: gap between chunks")):
        rows.append(
            [
                what,
                f"{m[f'direct:{label}:p50']:.2f} / {m[f'direct:{label}:p99']:.2f}",
                f"{m[f'ingress:{label}:p50']:.2f} / {m[f'ingress:{label}:p99']:.2f}",
                f"{added(out, f'{label}:p50'):+.2f} / {added(out, f'{label}:p99'):+.2f}",
            ]
        )
    print(table(["figure", "direct p50/p99 ms", "ingress p50/p99 ms", "added p50/p99 ms"], rows))
    chunks = m["ingress:chunks"]
    per_chunk = (added(out, "last:p50") - added(out, "ttft:p50")) / max(1.0, chunks - 1)
    rate_direct, rate_ingress = m[f"direct:{SLOTS}:rate"], m[f"ingress:{SLOTS}:rate"]
    print(
        f"throughput at concurrency {SLOTS}: direct {rate_direct:.0f} calls/s, one ingress web process "
        f"{rate_ingress:.0f} calls/s = {rate_ingress / rate_direct:.2f}x"
    )
    cpu = ", ".join(f"{m[f'web_cpu_ms:{level}']:.2f} ms at {level}" for level in (1, 16, SLOTS))
    print(f"web process CPU per ingress call (load-independent): {cpu}")
    print(f"stream: {chunks:.0f} chunks per call; added delay per chunk (p50) {per_chunk:+.3f} ms")
    summary = {
        "complete_p50": added(out, "1:p50"),
        "ttft_p50": added(out, "ttft:p50"),
        "per_chunk": per_chunk,
    }
    for name, target in TARGETS_MS.items():
        print(f"target {name} <= {target} ms at concurrency 1: {summary[name]:+.2f} ms ->",
              "met" if summary[name] <= target else "MISSED")  # fmt: skip
    return summary


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_benchmark(__doc__ or "", measure, report, argv, default_runs=5)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
