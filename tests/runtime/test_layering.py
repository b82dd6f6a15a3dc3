"""runtime/ is the engine: importable and usable without Django settings or Django at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, pkgutil, sys
import runtime
names = [m.name for m in pkgutil.walk_packages(runtime.__path__, "runtime.")]
for name in names:
    importlib.import_module(name)
leaked = sorted(k for k in sys.modules if k == "django" or k.startswith("django."))
print(len(names), leaked)
"""


def test_runtime_modules_import_without_django() -> None:
    # A fresh interpreter: this test process itself has Django loaded by pytest-django.
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout.split(maxsplit=1)
    assert int(out[0]) >= 20
    assert out[1].strip() == "[]"
