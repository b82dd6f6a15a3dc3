"""Immutable value classes that cost what a plain class costs to build.

``@immutable`` is ``@dataclass(frozen=True, slots=True)`` to the type checker, and a slotted dataclass
with the same equality and hash at run time. Why: a frozen dataclass's ``__init__`` sets each field
through ``object.__setattr__``, about 0.4 µs a field on the 2-core benchmark machine against 0.05 for
a plain one. A call through the dispatcher builds 13 values (86 fields: the envelope, its claim, the
reply, the span's subject and outcome...); built frozen, they were a sixth of the dispatcher's
instructions per call at concurrency 16 (bench/RESULTS.md, issue 23).

Immutability is mypy's to enforce: it reads the decorator's ``frozen_default``, so assigning to a
field of a value is a type error, as it was, and ``runtime/`` is type-checked in CI. At run time the
assignment is not refused: nothing may rely on catching ``FrozenInstanceError``. Values change by
``dataclasses.replace``. Equal values hash equal, so values stay usable as dict keys and in sets.

Only ``runtime/``, where the hot path is, uses it. Elsewhere (the Django apps, which mypy does not
check) values stay frozen dataclasses, refused at run time.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar, dataclass_transform

__all__ = ["immutable"]

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def immutable(cls: type[_T], /) -> type[_T]:
    """The class as a slotted dataclass, frozen to mypy, hashed by its fields."""
    return dataclasses.dataclass(slots=True, unsafe_hash=True)(cls)
