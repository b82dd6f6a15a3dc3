"""Request cost: how much scheduler credit one queued request consumes.

Pure arithmetic, no I/O. The dispatcher computes a request's cost when it peeks the head of a pool's
queue and hands it to the scheduler (:class:`runtime.policy.scheduler.HeadItem`). An explicit ``cost_units``
from the envelope metadata wins; otherwise the cost is estimated from the number of images and pages.
A group whose ``cost_mode`` is ``tokens`` counts weighted tokens instead (:func:`token_cost`).
Either way it is clamped into ``[minimum, maximum]`` so that a single request can neither be free nor
hold a pool's credit hostage forever.
"""

from __future__ import annotations

from runtime.immutable import immutable

__all__ = ["CostModel", "request_cost", "token_cost"]


@immutable
class CostModel:
    """Weights of the cost estimate and the range every cost is clamped into."""

    base: int = 1
    per_image: int = 2
    per_page: int = 1
    minimum: int = 1
    maximum: int = 64
    # A group whose cost_mode is "tokens": one credit unit per this many weighted tokens (a prompt of
    # 1,000 tokens with the default 256 output tokens at weight 4 costs ceil(2024 / 256) = 8 units).
    tokens_per_unit: int = 256

    def __post_init__(self) -> None:
        if self.tokens_per_unit < 1:
            raise ValueError(f"CostModel.tokens_per_unit must be >= 1, got {self.tokens_per_unit}")
        for name in ("base", "per_image", "per_page"):
            if getattr(self, name) < 0:
                raise ValueError(f"CostModel.{name} must be >= 0, got {getattr(self, name)}")
        if self.minimum < 1:
            raise ValueError(f"CostModel.minimum must be >= 1, got {self.minimum}")
        if self.maximum < self.minimum:
            raise ValueError(
                f"CostModel.maximum ({self.maximum}) must be >= CostModel.minimum ({self.minimum})"
            )

    def clamp(self, units: int) -> int:
        """Clamp ``units`` into ``[minimum, maximum]``."""
        return max(self.minimum, min(self.maximum, units))


def request_cost(
    model: CostModel,
    *,
    cost_units: int | None,
    image_count: int,
    page_count: int,
    image_parts: int,
) -> int:
    """Cost of one request in scheduler credit units.

    ``cost_units`` (explicit, from metadata) wins when given. Otherwise
    ``base + per_image * max(image_count, image_parts) + per_page * page_count``, where
    ``image_parts`` is the number of image content parts found in the messages (so that an
    undeclared image still costs). Negative inputs count as 0. The result is always in
    ``[model.minimum, model.maximum]``.
    """
    if cost_units is not None:
        return model.clamp(max(0, cost_units))
    images = max(0, image_count, image_parts)
    pages = max(0, page_count)
    return model.clamp(model.base + model.per_image * images + model.per_page * pages)


def token_cost(model: CostModel, *, cost_units: int | None, weighted_tokens: float) -> int:
    """Cost of one request in credit units when the group's DRR counts tokens (``cost_mode`` tokens).

    ``weighted_tokens`` is the pool's ``TenantCost`` of the request's token estimate
    (:mod:`runtime.policy.tokens`). An explicit ``cost_units`` still wins, as in :func:`request_cost`;
    otherwise one unit per ``tokens_per_unit`` weighted tokens, rounded up, clamped like every cost.
    """
    if cost_units is not None:
        return model.clamp(max(0, cost_units))
    if not weighted_tokens > 0:  # also NaN
        return model.minimum
    units = min(float(model.maximum), -(-weighted_tokens // model.tokens_per_unit))
    return model.clamp(int(units))
