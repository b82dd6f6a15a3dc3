"""Tests for runtime.policy.cost: parameter tables plus a couple of properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.policy.cost import CostModel, request_cost

DEFAULT = CostModel()


@pytest.mark.parametrize(
    ("cost_units", "image_count", "page_count", "image_parts", "expected"),
    [
        (None, 0, 0, 0, 1),  # base only
        (None, 1, 0, 0, 3),  # 1 + 2*1
        (None, 0, 0, 2, 5),  # image parts count when undeclared
        (None, 3, 0, 1, 7),  # max(image_count, image_parts)
        (None, 1, 3, 4, 12),  # 1 + 2*4 + 3
        (None, 0, 5, 0, 6),
        (None, 100, 0, 0, 64),  # clamped to maximum
        (None, -5, -2, -1, 1),  # negatives count as 0
        (10, 100, 100, 100, 10),  # explicit wins over estimate
        (0, 0, 0, 0, 1),  # explicit clamped up to minimum
        (-3, 5, 0, 0, 1),  # negative explicit -> 0 -> minimum
        (1000, 0, 0, 0, 64),  # explicit clamped down to maximum
        (64, 0, 0, 0, 64),
    ],
)
def test_request_cost_table(cost_units, image_count, page_count, image_parts, expected):
    got = request_cost(
        DEFAULT,
        cost_units=cost_units,
        image_count=image_count,
        page_count=page_count,
        image_parts=image_parts,
    )
    assert got == expected


def test_custom_model():
    model = CostModel(base=0, per_image=5, per_page=0, minimum=2, maximum=20)
    assert request_cost(model, cost_units=None, image_count=0, page_count=9, image_parts=0) == 2
    assert request_cost(model, cost_units=None, image_count=3, page_count=0, image_parts=0) == 15
    assert request_cost(model, cost_units=None, image_count=5, page_count=0, image_parts=0) == 20


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"minimum": 0}, "minimum must be >= 1"),
        ({"minimum": 5, "maximum": 4}, "maximum (4) must be >= CostModel.minimum (5)"),
        ({"base": -1}, "base must be >= 0"),
        ({"per_image": -1}, "per_image must be >= 0"),
        ({"per_page": -2}, "per_page must be >= 0"),
    ],
)
def test_invalid_model(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        CostModel(**kwargs)


def test_minimum_equal_maximum_is_valid():
    model = CostModel(minimum=7, maximum=7)
    assert request_cost(model, cost_units=None, image_count=9, page_count=9, image_parts=9) == 7


@given(
    explicit=st.none() | st.integers(-1000, 1000),
    images=st.integers(-10, 100),
    pages=st.integers(-10, 100),
    parts=st.integers(-10, 100),
    minimum=st.integers(1, 10),
    span=st.integers(0, 100),
)
def test_cost_always_in_range(explicit, images, pages, parts, minimum, span):
    model = CostModel(minimum=minimum, maximum=minimum + span)
    got = request_cost(model, cost_units=explicit, image_count=images, page_count=pages, image_parts=parts)
    assert model.minimum <= got <= model.maximum


@given(images=st.integers(0, 50), pages=st.integers(0, 50))
def test_cost_monotonic_in_images_and_pages(images, pages):
    def cost(i: int, p: int) -> int:
        return request_cost(DEFAULT, cost_units=None, image_count=i, page_count=p, image_parts=0)

    assert cost(images, pages) <= cost(images + 1, pages)
    assert cost(images, pages) <= cost(images, pages + 1)


# ------------------------------------------------------------------ token cost (group cost_mode tokens)

from runtime.policy.cost import token_cost  # noqa: E402


@pytest.mark.parametrize(
    ("cost_units", "weighted", "expected"),
    [
        (None, 0, 1),  # nothing estimated: still the minimum
        (None, 1, 1),
        (None, 256, 1),
        (None, 257, 2),  # rounded up
        (None, 2024.0, 8),
        (None, 10**12, 64),  # clamped to the maximum
        (None, float("inf"), 64),
        (None, float("nan"), 1),
        (None, -50, 1),
        (5, 10**6, 5),  # explicit cost_units still win
    ],
)
def test_token_cost_table(cost_units: int | None, weighted: float, expected: int) -> None:
    assert token_cost(DEFAULT, cost_units=cost_units, weighted_tokens=weighted) == expected


@given(st.floats(allow_nan=False, min_value=0, max_value=1e9), st.floats(min_value=0, max_value=1e9))
def test_token_cost_is_monotone_and_bounded(weighted: float, more: float) -> None:
    low = token_cost(DEFAULT, cost_units=None, weighted_tokens=weighted)
    high = token_cost(DEFAULT, cost_units=None, weighted_tokens=weighted + more)
    assert DEFAULT.minimum <= low <= high <= DEFAULT.maximum


def test_tokens_per_unit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="tokens_per_unit"):
        CostModel(tokens_per_unit=0)
