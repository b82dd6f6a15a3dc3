"""Formatting filters for the history pages."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def seconds(value: Any) -> str:
    """0.0123 -> '12.3 ms', 2.5 -> '2.50 s', None -> '—'."""
    if value is None:
        return "—"
    value = float(value)
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


@register.filter
def percent(value: Any) -> str:
    return "—" if value is None else f"{float(value) * 100:.1f}%"


@register.filter
def number(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"


@register.filter
def get(mapping: Any, key: Any) -> Any:
    return mapping.get(key) if mapping else None


@register.filter
def nanos_ms(value: Any) -> str:
    return "—" if value is None else f"{int(value) / 1e6:.1f} ms"
