"""The dispatcher process's garbage collector: what exists at start frozen, young collections rarer,
cycles still collected. In a process of its own: the settings are the whole interpreter's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, weakref
from runtime import gc_tuning

class Node:
    pass

started = gc.get_freeze_count()
line = gc_tuning.tune_for_service()
print(gc.get_threshold()[0], started, gc.get_freeze_count() > 0, line)
node = Node()
node.self = node  # a cycle: reference counting alone never frees it
freed = weakref.ref(node)
del node
held = [[] for _ in range(gc_tuning.YOUNG_THRESHOLD // 2)]
print(freed() is None)
held += [[] for _ in range(gc_tuning.YOUNG_THRESHOLD)]
print(freed() is None)
"""


def test_a_tuned_process_freezes_its_start_and_still_collects_cycles() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    tuned, half_way, past = run.stdout.splitlines()
    threshold, frozen_before, frozen, *line = tuned.split()
    assert (int(threshold), frozen_before, frozen) == (50_000, "0", "True")
    assert " ".join(line).startswith("gc thresholds 50000/")
    # Not collected after the default's 700 allocations, nor half the new threshold's; collected past it.
    assert (half_way, past) == ("False", "True")
