"""runtime/ is the engine: importable and usable without Django settings or Django at all.

Its packages form layers, and an import only ever points down (or within its own layer):

    0  runtime.errors, runtime.backoff, runtime.eventloop,     leaves
       runtime.gc_tuning, runtime.immutable
    1  runtime.policy                                          pure rules (no I/O)
    2  runtime.wire                                            the contract and configuration objects
    3  runtime.valkey, runtime.telemetry.{semconv,spans}       the connection, span records
    4  runtime.queue                                           the queue protocol: keys, Lua, encodings
    5  runtime.config                                          the engines' settings
    6  runtime.backends, runtime.telemetry                     the HTTP edge, tracing
    7  runtime.dispatch, runtime.producer                      the two clients of the queue

The producer and the dispatcher never import each other: both speak to the queue through
runtime.queue. Every Lua script lives in runtime/queue/lua/, and nothing else in the project holds
Lua source (tests may, for a script that only a test needs).
"""

from __future__ import annotations

import ast
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

LAYERS: tuple[tuple[str, ...], ...] = (
    ("runtime.errors", "runtime.backoff", "runtime.eventloop", "runtime.gc_tuning", "runtime.immutable"),
    ("runtime.policy",),
    ("runtime.wire",),
    ("runtime.valkey", "runtime.telemetry.semconv", "runtime.telemetry.spans"),
    ("runtime.queue",),
    ("runtime.config",),
    ("runtime.backends", "runtime.telemetry"),
    ("runtime.dispatch", "runtime.producer", "runtime.whatif"),
)
# Each side's packages and the other side's: neither client of the queue imports the other.
CLIENTS = {"runtime.producer": "runtime.dispatch", "runtime.dispatch": "runtime.producer"}
# Where Lua may not be: every package of the project (tests aside).
PROJECT = (
    "runtime", "pools", "dashboard", "ingress", "history", "ops", "simulator", "dispatch_project", "bench",
)  # fmt: skip


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = {_module_name(path): path for path in (ROOT / "runtime").rglob("*.py")}


def _layer(name: str) -> int | None:
    """The layer of the longest prefix that names ``name`` (a module or its package)."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def _imports(path: Path) -> set[str]:
    """The runtime modules ``path`` imports (``from a import b`` counts as ``a.b`` when that is one)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "runtime" or name.startswith("runtime.")}


def upward_arrows(modules: dict[str, Path]) -> list[str]:
    arrows = []
    for name, path in sorted(modules.items()):
        mine = _layer(name)
        for imported in sorted(_imports(path)):
            theirs = _layer(imported)
            if mine is not None and theirs is not None and theirs > mine:
                arrows.append(f"{name} (layer {mine}) -> {imported} (layer {theirs})")
    return arrows


def client_arrows(modules: dict[str, Path]) -> list[str]:
    arrows = []
    for name, path in sorted(modules.items()):
        for side, other in CLIENTS.items():
            if name == side or name.startswith(side + "."):
                arrows += [
                    f"{name} -> {imported}"
                    for imported in sorted(_imports(path))
                    if imported == other or imported.startswith(other + ".")
                ]
    return arrows


def lua_outside_the_queue() -> list[str]:
    room = ROOT / "runtime" / "queue"
    found = []
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*")):
            if room in path.parents or path.suffix not in (".py", ".lua"):
                continue
            if path.suffix == ".lua" or "redis.call" in path.read_text(encoding="utf-8"):
                found.append(str(path.relative_to(ROOT)))
    return found


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


def test_every_runtime_module_has_a_layer() -> None:
    assert [name for name in MODULES if name != "runtime" and _layer(name) is None] == []


def test_no_import_points_up_a_layer() -> None:
    assert upward_arrows(MODULES) == []


def test_the_check_sees_an_upward_arrow(tmp_path: Path) -> None:
    # As runtime/wire/backendconfig.py once did: configuration importing the breaker's behaviour.
    config = tmp_path / "backendconfig.py"
    config.write_text("from runtime.backends.breaker import Breaker\n")
    arrows = upward_arrows({"runtime.wire.backendconfig": config})
    assert arrows == ["runtime.wire.backendconfig (layer 2) -> runtime.backends.breaker (layer 6)"]


def test_the_producer_and_the_dispatcher_never_import_each_other() -> None:
    assert client_arrows(MODULES) == []


def test_the_check_sees_the_producer_importing_the_dispatcher(tmp_path: Path) -> None:
    # As runtime/producer.py once did, for its admission script.
    producer = tmp_path / "producer.py"
    producer.write_text("from runtime.dispatch.admission import ADMIT_PUSH\n")
    assert client_arrows({"runtime.producer": producer}) == ["runtime.producer -> runtime.dispatch.admission"]


def test_lua_lives_only_in_the_queue_room() -> None:
    assert lua_outside_the_queue() == []
    assert sorted(p.name for p in (ROOT / "runtime" / "queue" / "lua").glob("*.lua"))
