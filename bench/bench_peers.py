"""Our queued path against LiteLLM proxy, in front of the same simulator process, in one run.

Run: ``python bench/bench_peers.py [--quick] [--runs N]``.

Processes: one zero-latency simulator; a private Valkey and one dispatcher (``bench._dispatcher_proc``,
64 slots); one LiteLLM proxy (``litellm --config ...``, one worker) whose only model routes to the
simulator. This process is the client of all three paths, with the same client code
(``Producer.submit``): ``direct`` (``Producer(direct_backend=OpenAIBackend(simulator))``, the baseline
of both), ``queued`` (through Valkey and the dispatcher) and ``litellm``
(``Producer(direct_backend=OpenAIBackend(proxy, api_key=master key))``: the same adapter, pointed at
the proxy). At each concurrency (1, 16, 64 closed-loop workers) every run measures the three paths
back to back, in a rotating order; tables show medians over runs.

Middle-tier CPU per call: the dispatcher process plus Valkey (``INFO cpu``) for the queued path, the
proxy process and its children for LiteLLM, each as a CPU-time delta over the measured calls.

LiteLLM is installed on first use into its own virtual environment (``var/litellm-venv``, never a
dependency of the project; see ``bench/litellm_proxy.py``, which also sets it up); when that fails the
LiteLLM rows are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    client,
    closed_loop,
    cpu_seconds,
    dispatcher_procs,
    group,
    machine,
    measured_load,
    median,
    new_keys,
    private_valkey_server,
    publish,
    run_benchmark,
    scratch,
    simulator_proc,
    table,
    tree_cpu_seconds,
    valkey_cpu_ms,
)
from bench.litellm_proxy import MASTER_KEY, litellm_binary, litellm_proxy, litellm_version, openai_model
from runtime.backends.adapter import OpenAIBackend
from runtime.producer import Producer
from runtime.wire.groupconfig import PoolConfig

LEVELS = (1, 16, 64)
SLOTS = 64
PATHS = ("direct", "queued", "litellm")


def calls_at(level: int, quick: bool) -> int:
    return {1: 60, 16: 320, 64: 640}[level] if quick else {1: 400, 16: 1600, 64: 2560}[level]


Sample = dict[str, float]


async def measure(quick: bool, runs: int) -> dict[str, Any]:
    # A quick (smoke) run never spends minutes installing: it uses LiteLLM only when already there.
    binary, why = litellm_binary(install=not quick)
    results: dict[tuple[int, str], list[Sample]] = {}
    meta = {"litellm": why if binary is None else f"litellm {litellm_version()} ({why})"}
    with (
        private_valkey_server() as valkey,
        simulator_proc() as sim_url,
        scratch() as workdir,
        contextlib.ExitStack() as stack,
    ):
        models = [openai_model("sim-model", sim_url, "sk-sim")]
        proxy = stack.enter_context(litellm_proxy(binary, models, workdir)) if binary else None
        keys = new_keys()
        config = group(sim_url, [PoolConfig("default", max_concurrent=SLOTS)], policy="fifo", total=SLOTS)
        backends = [OpenAIBackend(sim_url, max_connections=SLOTS)]
        if proxy:
            backends.append(OpenAIBackend(proxy[0], api_key=MASTER_KEY, max_connections=SLOTS))
        async with client(valkey.url) as conn:
            await publish(conn, keys, config)
            with dispatcher_procs(valkey.url, keys.prefix, config.group_id, 1, SLOTS) as (dispatcher,):

                async def queued_cpu() -> dict[str, float]:
                    return {"cpu_ms": cpu_seconds(dispatcher.pid) * 1000 + await valkey_cpu_ms(conn)}

                async def proxy_cpu() -> dict[str, float]:
                    return {"cpu_ms": tree_cpu_seconds(proxy[1].pid) * 1000 if proxy else 0.0}

                async def no_cpu() -> dict[str, float]:
                    return {"cpu_ms": 0.0}

                async with contextlib.AsyncExitStack() as producers:
                    paths = {
                        "direct": (await producers.enter_async_context(_direct(backends[0])), no_cpu),
                        "queued": (
                            await producers.enter_async_context(Producer(conn, keys=keys)),
                            queued_cpu,
                        ),
                    }
                    if proxy:
                        paths["litellm"] = (
                            await producers.enter_async_context(_direct(backends[1])),
                            proxy_cpu,
                        )
                    for producer, _ in paths.values():  # warm connections, caches and the proxy's router
                        await closed_loop(producer, "default", SLOTS, 2 * SLOTS)
                    names = list(paths)
                    for run in range(runs):
                        for level in LEVELS:
                            shift = run % len(names)
                            for name in names[shift:] + names[:shift]:
                                producer, cpu = paths[name]
                                sample = await measured_load(producer, level, calls_at(level, quick), cpu)
                                results.setdefault((level, name), []).append(sample)
        for backend in backends:
            await backend.aclose()
    return {"results": results, "meta": meta}


def _direct(backend: OpenAIBackend) -> Producer:
    return Producer(None, direct_backend=backend)  # type: ignore[arg-type]


def _med(samples: list[Sample], field: str) -> float:
    return median([s[field] for s in samples])


def _added(results: dict[tuple[int, str], list[Sample]], level: int, name: str, field: str) -> float:
    """Median over runs of (path - direct) for one percentile, each pair from the same run."""
    pairs = zip(results[(level, name)], results[(level, "direct")], strict=True)
    return median([path[field] - direct[field] for path, direct in pairs])


def report(measured: dict[str, Any], runs: int, quick: bool) -> dict[str, Any]:
    results, meta = measured["results"], measured["meta"]
    print(
        f"# peers: direct vs queued (1 dispatcher) vs LiteLLM proxy, median of {runs} runs"
        f"{' (quick)' if quick else ''}"
    )
    print(f"# {machine()}; {meta['litellm']}")
    rows, summary = [], {}
    for level in LEVELS:
        for name in PATHS:
            samples = results.get((level, name))
            if not samples:
                continue
            direct = results[(level, "direct")]
            add50 = _added(results, level, name, "p50") if name != "direct" else 0.0
            add99 = _added(results, level, name, "p99") if name != "direct" else 0.0
            rate = _med(samples, "rate")
            rows.append(
                [
                    level,
                    name,
                    f"{_med(samples, 'p50'):.2f} / {_med(samples, 'p99'):.2f}",
                    f"{rate:.0f}",
                    f"{rate / _med(direct, 'rate'):.2f}",
                    "-" if name == "direct" else f"{add50:+.2f} / {add99:+.2f}",
                    "-" if name == "direct" else f"{_med(samples, 'cpu_ms'):.3f}",
                ]
            )
            summary[(level, name)] = {
                "rate": rate,
                "added_p50": add50,
                "added_p99": add99,
                "cpu_ms": _med(samples, "cpu_ms"),
            }
    print(
        table(
            [
                "concurrency",
                "path",
                "p50/p99 ms",
                "completions/s",
                "x direct",
                "added p50/p99 ms",
                "middle-tier CPU ms/call",
            ],
            rows,
        )
    )
    _print_targets(summary)
    return {f"{level}:{name}": value for (level, name), value in summary.items()}


def _print_targets(summary: dict[tuple[int, str], dict[str, float]]) -> None:
    if (1, "litellm") not in summary:
        print("LiteLLM rows skipped: no comparison targets checked")
        return
    for level in (1, 16):
        ours, theirs = summary[(level, "queued")], summary[(level, "litellm")]
        speed = ours["rate"] / theirs["rate"]
        added = ours["added_p50"] / theirs["added_p50"] if theirs["added_p50"] > 0 else float("nan")
        print(
            f"concurrency {level}: queued/litellm throughput {speed:.1f}x (target >= 5x) -> "
            f"{'met' if speed >= 5 else 'MISSED'}; added p50 queued/litellm {added:.2f} (target <= 0.25) -> "
            f"{'met' if added <= 0.25 else 'MISSED'}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_benchmark(__doc__ or "", measure, report, argv)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
