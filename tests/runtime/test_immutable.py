"""``@immutable``: frozen to mypy, a plain slotted dataclass to build, equal values hashing equal."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
from mypy import api as mypy_api

from runtime.immutable import immutable
from runtime.wire.reply import Timing

ROOT = Path(__file__).resolve().parents[2]


@immutable
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = dataclasses.field(default=())


def test_a_value_is_a_slotted_dataclass_that_compares_and_hashes_by_its_fields() -> None:
    a, b = Point(1, 2), Point(1, 2)
    assert a == b and a is not b
    assert hash(a) == hash(b)
    assert {a: "seen"}[b] == "seen"
    assert Point(1) != Point(2)
    assert [f.name for f in dataclasses.fields(Point)] == ["x", "y", "tags"]
    assert not hasattr(a, "__dict__")
    with pytest.raises(AttributeError):
        a.z = 3  # type: ignore[attr-defined]  # slots: no field of that name


def test_a_value_changes_only_by_replace_which_leaves_the_original_as_it_was() -> None:
    a = Point(1, 2, ("t",))
    b = dataclasses.replace(a, y=5)
    assert (a.y, b.y, b.tags) == (2, 5, ("t",))


def test_mypy_refuses_an_assignment_to_a_field_of_a_value(tmp_path: Path) -> None:
    """What keeps values immutable: the type check CI runs on runtime/ (the run time does not)."""
    snippet = tmp_path / "mutates.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from runtime.immutable import immutable
            from runtime.wire.reply import Timing

            @immutable
            class Point:
                x: int

            Point(1).x = 2
            Timing(0.0, 1.0, 1.0).execution_s = 2.0
            Point(1, 2)
            """
        )
    )
    out, _, status = mypy_api.run(
        [str(snippet), "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache")]
    )
    assert status == 1, out
    assert 'Property "x" defined in "Point" is read-only' in out
    assert 'Property "execution_s" defined in "Timing" is read-only' in out
    assert 'Too many arguments for "Point"' in out  # the decorator's signature reaches mypy too


def test_the_project_values_are_built_as_values() -> None:
    """A project value (here the reply's timing) takes the decorator's semantics."""
    timing = Timing(0.1, 0.2, 0.3)
    assert timing == Timing(0.1, 0.2, 0.3) and hash(timing) == hash(Timing(0.1, 0.2, 0.3))
    assert not hasattr(timing, "__dict__")
