"""What naming an envelope's endpoint costs the chat hot path: decode + encode of a queued chat envelope,
this checkout against a "before" revision, in the same run; and the embeddings / completions envelopes.

Run: ``python bench/bench_envelope_endpoints.py [--before main] [--runs N] [--quick]``.

Every dispatcher decodes each envelope it peeks (``Envelope.decode``) and every producer encodes one per
submit, so issue 24's endpoint field and call dispatch (:func:`runtime.wire.operations.decode_call`)
sit on the hot path of every chat call. Each variant runs in a subprocess of its own tree (``before``:
``git archive`` of ``--before``), alternating, ``ITERATIONS`` decode+encode pairs per run; the table
shows the median µs per pair and the ratio after / before. The ``embeddings`` and ``completions``
rows exist only after.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, exported, machine, median, table

ITERATIONS = 20_000
PROBE = """
import sys, time
from runtime.wire import contract
CHAT = {"model": "sim-model", "messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarise page 3 of the contract, please." * 4}],
        "max_tokens": 256, "temperature": 0.2}
calls = {"chat": lambda: contract.ChatCall.from_openai(CHAT)}
if hasattr(contract, "EmbeddingsCall"):
    calls["embeddings"] = lambda: contract.EmbeddingsCall.from_openai(
        {"model": "emb", "input": ["page one of the contract " * 8, "page two " * 8], "dimensions": 256})
    calls["completions"] = lambda: contract.CompletionsCall.from_openai(
        {"model": "sim-model", "prompt": "Summarise page 3 of the contract, please." * 4, "max_tokens": 256})
n = int(sys.argv[1])
for name, make in calls.items():
    raw = contract.Envelope("r" * 32, "producer-1", "pool", make(), time.time()).encode()
    for _ in range(1000):
        contract.Envelope.decode(raw).encode()
    start = time.perf_counter()
    for _ in range(n):
        contract.Envelope.decode(raw).encode()
    print(name, (time.perf_counter() - start) / n * 1e6)
"""


def measure(root: Path, iterations: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(iterations)], cwd=root, capture_output=True, text=True, check=True
    )
    return {line.split()[0]: float(line.split()[1]) for line in done.stdout.splitlines()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="git revision to compare against")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    iterations = 2_000 if args.quick else ITERATIONS
    runs = 1 if args.quick else args.runs
    with contextlib.ExitStack() as stack:
        before_root = stack.enter_context(exported(args.before))
        before: dict[str, list[float]] = {}
        after: dict[str, list[float]] = {}
        for _ in range(runs):  # alternating, so load changes hit both variants alike
            for results, root in ((before, before_root), (after, ROOT)):
                for name, us in measure(root, iterations).items():
                    results.setdefault(name, []).append(us)
    print(machine())
    print(f"{runs} runs x {iterations} decode+encode pairs, median us per pair; before = {args.before}")
    rows = []
    for name, values in after.items():
        was = median(before[name]) if name in before else None
        now = median(values)
        rows.append([name, f"{was:.2f}" if was else "-", f"{now:.2f}", f"{now / was:.2f}x" if was else "-"])
    print(table(["envelope", "before us", "after us", "after/before"], rows))


if __name__ == "__main__":
    main()
