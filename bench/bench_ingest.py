"""History ingest: the real ingester draining a real Valkey span stream into chDB, before vs after.

Two measurements per variant, each in its own process importing the project from that variant's tree
(this checkout, and ``--before REF`` exported with ``git archive``), interleaved run by run:

``drain``  a stream prefilled with ``--spans`` entries (the stored shape of ``tests/history``'s
           factories, 4 pools), one warm-up batch, then timed until empty: spans/s and process CPU per
           1,000 spans (``time.process_time``: Python plus chDB's threads, merges included).
``paced``  a producer process adds spans through the exporter's own script (XADD, then the
           approximate MAXLEN cap that counts what it deletes) at ``--rate`` spans/s for ``--seconds``
           while the ingester runs on a thread as ``runhistory`` does: the trimmed count (spans lost),
           the largest backlog seen, and the ingester's CPU per 1,000 spans.

``--phases`` (this tree only) drains with one batch at a time and splits the CPU per 1,000 spans into the
ingester's two halves: what the calling thread does (XREADGROUP, decode, XACK and trim) and the INSERT
(process CPU across it: clickhouse-connect plus chDB's threads). Read-ahead overlaps the two, so on two
free cores a drain is bound by the larger half instead of their sum.
``--ahead`` (this tree only) drains with read-ahead on and off, interleaved run by run.

``--views`` (this tree only) instead measures what each materialized view adds to an insert: the same
batches of 10,000 spans into ``otel_traces`` with no view, with each view alone, and with all of them.

One dispatcher at full rate exports about 3,000 spans/s (issue 14); ``--rate 9000`` is three.

Run: ``python bench/bench_ingest.py --before main`` (3 drain runs of 50,000 spans and 3 paced runs of
45 s at 9,000 spans/s per variant, ~10 min), or ``--quick``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
DISPATCHER_SPANS_PER_S = 3000
POOLS = ("interactive", "batch", "backfill", "eval")


def _payloads(count: int) -> list[bytes]:
    import orjson

    from tests.support.history_spans import execution_doc

    return [orjson.dumps(execution_doc(pool=POOLS[i % 4], ago_s=i / 1000)) for i in range(count)]


def _ingester(valkey_url: str, data_dir: str, prefix: str, **kwargs: Any) -> Any:
    import redis

    from history import schema
    from history.client import client_for
    from history.ingester import Ingester
    from runtime.queue.keys import KeySpace

    history = client_for(f"chdb://{data_dir}")
    schema.migrate(history, retention_days=30)
    conn = redis.Redis.from_url(valkey_url)
    return Ingester(conn, history, keys=KeySpace(prefix=prefix), **kwargs)


def child_drain(valkey_url: str, data_dir: str, spans: int, read_ahead: bool = True) -> dict[str, float]:
    from history.ingester import DEFAULT_BATCH_SIZE
    from runtime.queue.keys import KeySpace

    prefix = f"drain-{os.getpid()}"
    conn = _filled(valkey_url, spans, prefix)
    stream = KeySpace(prefix=prefix).span_stream()
    # A tree without the switch (before read-ahead) is always "off".
    extra = {} if read_ahead else {"read_ahead": False}
    ingester = _ingester(valkey_url, data_dir, prefix, block_ms=10, batch_size=1000, **extra)
    ingester.step()  # migrates, creates the group and stores a first small batch before timing
    ingester.batch_size = DEFAULT_BATCH_SIZE
    before = ingester.stats.inserted
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while ingester.step():
        pass
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    stored = ingester.stats.inserted - before
    conn.delete(stream)
    return {"spans_per_s": stored / wall, "cpu_ms_per_1000": cpu / stored * 1e6}


def _filled(valkey_url: str, spans: int, prefix: str) -> Any:
    import redis

    from runtime.queue.keys import KeySpace

    conn = redis.Redis.from_url(valkey_url)
    stream = KeySpace(prefix=prefix).span_stream()
    pipe = conn.pipeline(transaction=False)
    for payload in _payloads(spans):
        pipe.xadd(stream, {"span": payload})
    pipe.execute()
    return conn


def child_phases(valkey_url: str, data_dir: str, spans: int) -> dict[str, float]:
    from history.ingester import DEFAULT_BATCH_SIZE

    prefix = f"phases-{os.getpid()}"
    conn = _filled(valkey_url, spans, prefix)
    ingester = _ingester(valkey_url, data_dir, prefix, block_ms=10, batch_size=1000, read_ahead=False)
    ingester.step()
    ingester.batch_size = DEFAULT_BATCH_SIZE
    caller = insert = 0.0
    stored = 0
    run_insert = ingester._insert
    while True:
        cpu0 = time.process_time()
        batch = ingester._decode(ingester._read())
        if not batch.ids:
            break
        cpu1 = time.process_time()
        run_insert(batch)
        cpu2 = time.process_time()
        ingester.redis.xack(ingester.stream, "history", *batch.ids)
        ingester._trim(keys=[ingester.stream], args=["history"])
        caller += (cpu1 - cpu0) + (time.process_time() - cpu2)
        insert += cpu2 - cpu1
        stored += batch.rows
    conn.delete(ingester.stream)
    return {"caller_ms_per_1000": caller / stored * 1e6, "insert_ms_per_1000": insert / stored * 1e6}


def child_produce(valkey_url: str, prefix: str, rate: float, seconds: float) -> dict[str, float]:
    """Adds spans at ``rate`` for ``seconds`` in batches of 512 (the SDK's export batch)."""
    import redis

    from runtime.queue.keys import SPAN_STREAM_MAXLEN, KeySpace
    from runtime.queue.scripts import SPANS_ADD

    keys = KeySpace(prefix=prefix)
    conn = redis.Redis.from_url(valkey_url)
    add = conn.register_script(SPANS_ADD)
    payloads = _payloads(20_000)
    batch, sent, trimmed = 512, 0, 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        due = int(elapsed * rate) - sent
        if due < batch:
            time.sleep((batch - due) / rate)
            continue
        chunk = [payloads[(sent + i) % len(payloads)] for i in range(batch)]
        trimmed += int(
            add(keys=[keys.span_stream(), keys.span_trim_counter()], args=[*chunk, SPAN_STREAM_MAXLEN])
        )
        sent += batch
    return {"sent": sent, "trimmed": trimmed, "achieved_rate": sent / (time.perf_counter() - started)}


def child_paced(valkey_url: str, data_dir: str, rate: float, seconds: float) -> dict[str, float]:
    from history import ingester as module

    prefix = f"paced-{os.getpid()}"
    # As runhistory builds it (build_from_settings): the insert interval where the tree has one.
    extra = (
        {"min_insert_interval_s": module.INSERT_INTERVAL_S} if hasattr(module, "INSERT_INTERVAL_S") else {}
    )
    ingester = _ingester(valkey_url, data_dir, prefix, block_ms=500, **extra)
    ingester.step()  # migrates and creates the group before the producer starts
    stop = threading.Event()
    thread = threading.Thread(target=ingester.run, args=(stop,), daemon=True)
    producer = subprocess.Popen(
        [sys.executable, str(HERE), "--child", "produce", "--valkey", valkey_url, "--prefix", prefix,
         "--rate", str(rate), "--seconds", str(seconds)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    cpu0 = time.process_time()
    thread.start()
    backlog = 0
    while producer.poll() is None:
        backlog = max(backlog, int(ingester.redis.xlen(ingester.stream)))
        time.sleep(0.5)
    produced = json.loads(producer.stdout.read() if producer.stdout else "{}")
    deadline = time.monotonic() + 120
    while ingester.stats.acked < produced["sent"] - produced["trimmed"] and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    thread.join(10)
    cpu = time.process_time() - cpu0
    return {
        "trimmed": produced["trimmed"],
        "sent": produced["sent"],
        "rate": produced["achieved_rate"],
        "max_backlog": backlog,
        "cpu_ms_per_1000": cpu / max(1, ingester.stats.inserted) * 1e6,
    }


def child_views(data_dir: str, spans: int, runs: int) -> dict[str, list[float]]:
    """CPU per 1,000 spans of the insert alone into ``otel_traces`` with no view, each view alone (the
    hours with the minutes they roll up), and all of them: what each view costs an insert."""
    import orjson

    from history import schema
    from history.client import client_for
    from history.derived import DERIVED
    from history.ingester import span_row

    rows = [span_row(orjson.loads(p)) for p in _payloads(spans)]
    batches = [list(zip(*rows[i : i + 10_000], strict=True)) for i in range(0, spans, 10_000)]
    history = client_for(f"chdb://{data_dir}")
    by_name = {d.name: d for d in DERIVED}
    configs = {"no view": [], **{d.name: [d] for d in DERIVED if d.source == schema.TABLE}}
    configs[f"{schema.POOL_MINUTES} + {schema.POOL_HOURS}"] = [
        by_name[schema.POOL_MINUTES],
        by_name[schema.POOL_HOURS],
    ]
    configs["all views"] = list(DERIVED)
    results: dict[str, list[float]] = {}
    for run in range(runs):
        for n, (name, views) in enumerate(configs.items()):
            db = f"views_{run}_{n}"
            history.command(f"CREATE DATABASE `{db}`")
            history.command(schema.create_table_sql(db, 30))
            for view in views:
                history.command(view.create_sql(db, 30))
                history.command(view.view_sql(db))
            history.database = db
            cpu0 = time.process_time()
            for i, columns in enumerate(batches):
                history.insert(
                    schema.TABLE,
                    columns,
                    schema.INSERT_COLUMNS,
                    dedup_token=f"b{i}",
                    column_oriented=True,
                    column_types=schema.INSERT_TYPES,
                )
            results.setdefault(name, []).append((time.process_time() - cpu0) / spans * 1e6)
            history.command(f"DROP DATABASE `{db}` SYNC")
    return results


def _run_child(root: Path, args: list[str]) -> dict[str, float]:
    """This file's child mode in a fresh process importing the project from ``root``."""
    from bench._common import scratch

    with scratch() as data_dir:
        proc = subprocess.run(
            [sys.executable, str(HERE), "--data", str(data_dir), *args],
            cwd=root,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(root)},
            check=False,
        )
    if proc.returncode:
        raise RuntimeError(f"child {args} from {root} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _summary(name: str, runs: list[dict[str, float]], fields: tuple[str, ...]) -> list[str]:
    cells = [name]
    for field in fields:
        values = [r[field] for r in runs]
        cells.append(f"{statistics.median(values):,.1f} ({', '.join(f'{v:,.0f}' for v in values)})")
    return cells


def _child(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, os.environ.get("PYTHONPATH", str(ROOT)))
    if args.child in ("drain", "drain-serial"):
        result = child_drain(args.valkey, args.data, args.spans, read_ahead=args.child == "drain")
    elif args.child == "phases":
        result = child_phases(args.valkey, args.data, args.spans)
    elif args.child == "paced":
        result = child_paced(args.valkey, args.data, args.rate, args.seconds)
    else:
        result = child_produce(args.valkey, args.prefix, args.rate, args.seconds)
    print(json.dumps(result))
    return result


def _this_tree(args: argparse.Namespace) -> dict[str, Any]:
    """``--phases`` or ``--ahead``: runs of this tree only, each child in a fresh process."""
    from bench._common import private_valkey, table

    kinds = (
        {"phases": "phases"} if args.phases else {"read-ahead on": "drain", "read-ahead off": "drain-serial"}
    )
    runs: dict[str, list[dict[str, float]]] = {}
    with private_valkey() as valkey_url:
        for run in range(args.runs):
            names = list(kinds) if run % 2 == 0 else list(reversed(kinds))
            for name in names:
                got = _run_child(
                    ROOT, ["--child", kinds[name], "--valkey", valkey_url, "--spans", str(args.spans)]
                )
                runs.setdefault(name, []).append(got)
                print(f"run {run + 1} {name}: {got} load {os.getloadavg()[0]:.1f}", flush=True)
    fields = tuple(next(iter(runs.values()))[0])
    print(f"\n{args.spans:,} spans, batches of 10,000, median (runs):")
    print(table(["variant", *fields], [_summary(n, r, fields) for n, r in runs.items()]))
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="git revision to compare against (exported with git archive)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--spans", type=int, default=50_000, help="spans per drain run")
    parser.add_argument("--rate", type=float, default=9000.0, help="paced producer spans/s")
    parser.add_argument("--seconds", type=float, default=45.0, help="paced run length")
    parser.add_argument("--skip-paced", action="store_true")
    parser.add_argument("--views", action="store_true", help="only: what each materialized view costs")
    parser.add_argument("--phases", action="store_true", help="only: CPU of the ingester's two halves")
    parser.add_argument("--ahead", action="store_true", help="only: drain with read-ahead on vs off")
    parser.add_argument("--quick", action="store_true", help="1 run, 10,000 spans, 15 s paced")
    parser.add_argument(
        "--child", choices=["drain", "drain-serial", "phases", "paced", "produce"], help=argparse.SUPPRESS
    )
    parser.add_argument("--valkey", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args)
    if args.quick:
        args.runs, args.spans, args.seconds = 1, 10_000, 15.0
    sys.path.insert(0, str(ROOT))
    from bench._common import exported, machine, private_valkey, scratch, table

    print(machine(), flush=True)
    if args.views:
        with scratch() as data_dir:
            views = child_views(str(data_dir), args.spans, args.runs)
        print(f"\ninsert CPU ms per 1,000 spans, batches of 10,000, {args.spans:,} spans, median (runs):")
        rows = [
            (n, f"{statistics.median(v):.1f} ({', '.join(f'{x:.1f}' for x in v)})") for n, v in views.items()
        ]
        print(table(["views on otel_traces", "cpu_ms_per_1000"], rows))
        return {"views": views}
    if args.phases or args.ahead:
        return _this_tree(args)
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    with private_valkey() as valkey_url, contextlib.ExitStack() as stack:
        variants = {"after (this tree)": ROOT}
        if args.before:
            variants = {f"before ({args.before})": stack.enter_context(exported(args.before)), **variants}
        for run in range(args.runs):
            for name, root in variants.items():
                drain = _run_child(
                    root, ["--child", "drain", "--valkey", valkey_url, "--spans", str(args.spans)]
                )
                results.setdefault(name, {}).setdefault("drain", []).append(drain)
                print(f"run {run + 1} {name} drain: {drain}", flush=True)
                if not args.skip_paced:
                    paced = _run_child(
                        root,
                        ["--child", "paced", "--valkey", valkey_url, "--rate", str(args.rate),
                         "--seconds", str(args.seconds)],
                    )  # fmt: skip
                    results[name].setdefault("paced", []).append(paced)
                    print(f"run {run + 1} {name} paced: {paced}", flush=True)
    drain_fields = ("spans_per_s", "cpu_ms_per_1000")
    print(f"\ndrain, {args.spans:,} spans, median (runs):")
    print(
        table(["variant", *drain_fields], [_summary(n, r["drain"], drain_fields) for n, r in results.items()])
    )
    if not args.skip_paced:
        paced_fields = ("rate", "trimmed", "max_backlog", "cpu_ms_per_1000")
        print(f"\npaced, {args.rate:,.0f} spans/s for {args.seconds:.0f} s, median (runs):")
        print(
            table(
                ["variant", *paced_fields],
                [_summary(n, r["paced"], paced_fields) for n, r in results.items()],
            )
        )
    return results


if __name__ == "__main__":
    main()
