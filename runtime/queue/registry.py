"""The one loader of the queue's Lua scripts: ``runtime/queue/lua/<name>.lua``, read once per process.

Each script is a plain ``.lua`` file whose header comment declares its KEYS, ARGV and result; the
Python function that builds them sits in the module of the same operation. Two small steps turn a
file into the source that runs, and nothing else does:

* ``--! <fragment> name=value ...`` on a line of its own is replaced by the file
  ``lua/_<fragment>.lua`` (less its header comment) with each ``$name`` set to ``value`` (the
  wake-token push and the drain count are steps of several scripts);
* ``$CONSTANT`` is replaced by one of :data:`CONSTANTS`, values the Python side shares with the
  scripts (a reason's name, a TTL, the drain ring's size), so that both read one definition.

A ``$`` left over is an error at load time, not a Lua syntax error at the first call. Scripts run by
SHA through :class:`runtime.valkey.lua.LuaScript` (EVALSHA, loaded again after NOSCRIPT).
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from string import Template

from runtime.policy.admission import DRAIN_WINDOW_S, REASON_KEY_IN_FLIGHT, REASON_KEY_QUEUED
from runtime.queue.keys import DRAIN_TTL_S, KEY_SET_TTL_S, TICKET_TTL_MS, WAKE_HEAD_MAX_BYTES
from runtime.queue.turn import TURN_LEASE_MS
from runtime.valkey.lua import LuaScript

__all__ = ["CONSTANTS", "DRAIN_RING", "script", "source"]

DRAIN_RING = DRAIN_WINDOW_S + 2  # drain buckets: the window, the current second, one being reused

CONSTANTS: dict[str, object] = {
    "DRAIN_RING": DRAIN_RING,
    "DRAIN_TTL_S": DRAIN_TTL_S,
    "DRAIN_WINDOW_S": DRAIN_WINDOW_S,
    "KEY_SET_TTL_S": KEY_SET_TTL_S,
    "REASON_KEY_IN_FLIGHT": REASON_KEY_IN_FLIGHT,
    "REASON_KEY_QUEUED": REASON_KEY_QUEUED,
    "TICKET_TTL_MS": TICKET_TTL_MS,
    "TURN_LEASE_MS": TURN_LEASE_MS,
    "WAKE_HEAD_MAX_BYTES": WAKE_HEAD_MAX_BYTES,
}

_INCLUDE = re.compile(r"^--! (\w+)((?: \w+=\S+)*)$", re.MULTILINE)


def _read(name: str) -> str:
    return resources.files("runtime.queue").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def _include(match: re.Match[str]) -> str:
    fragment, params = match.group(1), match.group(2).split()
    values = dict(param.split("=", 1) for param in params)
    lines = _read(f"_{fragment}").splitlines()
    while lines and lines[0].startswith("--"):  # the fragment's own header, not repeated in each script
        lines.pop(0)
    # A fragment may include others (a fair pool's claim includes the claim, which counts the drain).
    return Template(_INCLUDE.sub(_include, "\n".join(lines))).substitute(values, **CONSTANTS)


@functools.cache
def source(name: str) -> str:
    """The runnable source of ``lua/<name>.lua``: fragments included, constants set."""
    text = Template(_INCLUDE.sub(_include, _read(name))).substitute(CONSTANTS)
    if "$" in text:
        raise ValueError(f"lua/{name}.lua: an unknown $ placeholder is left")
    return text


@functools.cache
def script(name: str) -> LuaScript:
    """``lua/<name>.lua`` as a :class:`LuaScript` (one object, one SHA per process)."""
    return LuaScript(source(name))
