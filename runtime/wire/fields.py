"""The JSON field checks every part of the wire contract shares, and the contract's version.

Decoding is strict: a value that does not match raises :class:`MalformedEnvelope` saying which field
is wrong and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from runtime.errors import MalformedEnvelope

CONTRACT_VERSION = 1

_NUMBER = (int, float)

# Wall-clock times an envelope may carry (seconds since the epoch): 1970 to 2100. Anything else is a
# bug or an attack, and would overflow nanosecond span timestamps (int64) downstream.
MIN_WALL_CLOCK_S = 0.0
MAX_WALL_CLOCK_S = 4_102_444_800.0


def _fail(what: str) -> MalformedEnvelope:
    return MalformedEnvelope(what)


def _expect(value: Any, types: tuple[type, ...] | type, what: str) -> Any:
    # bool is an int in Python; a JSON true is never a valid count or number here.
    if type(value) is not bool and isinstance(value, types):
        return value
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _fail(f"{what} must be {_type_names(types)}, got a boolean")
    if not isinstance(value, types):
        raise _fail(f"{what} must be {_type_names(types)}, got {type(value).__name__}")
    return value


def _type_names(types: tuple[type, ...] | type) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        bool: "a boolean",
    }
    seq = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in seq)


def _check_str_values(mapping: Mapping[Any, Any], what: str) -> None:
    """Every value of ``mapping`` must be a string; the message names the first key that is not."""
    for key, value in mapping.items():
        if type(value) is not str:
            _expect(value, str, f"{what}[{key!r}]")


def _count(value: Any, what: str, *, minimum: int) -> int:
    count: int = _expect(value, int, what)
    if count < minimum:
        raise _fail(f"{what} must be at least {minimum}, got {count}")
    return count


def _wall_clock(value: Any, what: str) -> float:
    seconds = value if type(value) is float else float(_expect(value, _NUMBER, what))
    if not MIN_WALL_CLOCK_S <= seconds <= MAX_WALL_CLOCK_S:  # also refuses NaN
        raise _fail(
            f"{what} is out of range: {value!r} is not a time between {MIN_WALL_CLOCK_S:.0f} and "
            f"{MAX_WALL_CLOCK_S:.0f} seconds since the epoch"
        )
    return seconds


def _non_empty_str(value: Any, what: str) -> str:
    if type(value) is not str:
        _expect(value, str, what)
    if not value:
        raise _fail(f"{what} must not be empty")
    return value


def _load(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _fail(f"{what} is not valid JSON: {exc}") from exc
    return _expect(data, dict, what)
