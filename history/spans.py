"""A span stream entry as an ``otel_traces`` row, and a batch's insert deduplication token.

Pure: no I/O. Every string value is stored as text with credentials scrubbed again (the exporter
scrubbed them already; a span written by another tool may not have been).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

import orjson

from runtime.telemetry.span_json import scrub_text, scrub_value

# Spans repeat the same few backend URLs; long texts (messages) are rarely repeated and not kept.
_scrub_url = functools.lru_cache(maxsize=4096)(scrub_text)


def _to_str(value: Any) -> str:
    kind = type(value)  # exact types first: JSON gives nothing else, and isinstance chains cost
    if kind is str:
        if "://" not in value:
            return value
        return _scrub_url(value) if len(value) <= 512 else scrub_text(value)
    if kind is int or kind is float:
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, int | float):
        return repr(value)
    return scrub_text(orjson.dumps(scrub_value(value)).decode())


def _str_map(mapping: Any) -> dict[str, str]:
    if not mapping:
        return {}
    # Most values are plain strings: kept as they are without a call per value.
    return {str(k): v if type(v) is str and "://" not in v else _to_str(v) for k, v in mapping.items()}


def _str_map_in_place(mapping: Any) -> dict[str, str]:
    """The same, rewriting a map this module owns (fresh from JSON, keys already strings): no new dict."""
    if not mapping:
        return {}
    for k, v in mapping.items():
        if type(v) is not str or "://" in v:
            mapping[k] = _to_str(v)  # a value replaced, no key added: iterating on is safe
    return mapping  # type: ignore[no-any-return]


_NO_EVENTS: tuple[list[Any], ...] = ([], [], [], [], [], [], [])  # shared, never mutated


def _events_and_links(doc: dict[str, Any], str_map: Callable[[Any], dict[str, str]]) -> tuple[list[Any], ...]:
    events = doc.get("events") or []
    links = doc.get("links") or []
    if not events and not links:
        return _NO_EVENTS
    return (
        [int(e["ts_ns"]) for e in events],
        [str(e["name"]) for e in events],
        [str_map(e.get("attributes")) for e in events],
        [str(ln["trace_id"]) for ln in links],
        [str(ln["span_id"]) for ln in links],
        [str(ln.get("trace_state") or "") for ln in links],
        [str_map(ln.get("attributes")) for ln in links],
    )


def entry_row(payload: bytes) -> list[Any]:
    """A stream entry's JSON as a row of ``schema.INSERT_COLUMNS``; raises on a malformed entry."""
    return _row(orjson.loads(payload), _str_map_in_place)


def span_row(doc: dict[str, Any]) -> list[Any]:
    """One decoded stream entry as a row of ``schema.INSERT_COLUMNS`` (credentials scrubbed again);
    ``doc`` is left as it was."""
    return _row(doc, _str_map)


def _row(doc: dict[str, Any], str_map: Callable[[Any], dict[str, str]]) -> list[Any]:
    get = doc.get
    start = int(doc["start_ns"])
    end = int(get("end_ns") or start)
    resource = str_map(get("resource"))
    scope = get("scope") or {}
    return [
        start,
        str(doc["trace_id"]),
        str(doc["span_id"]),
        str(get("parent_span_id") or ""),
        str(get("trace_state") or ""),
        str(doc["name"]),
        str(get("kind") or "Internal"),
        resource.get("service.name", ""),
        resource,
        str(scope.get("name") or ""),
        str(scope.get("version") or ""),
        str_map(get("attributes")),
        max(0, end - start),
        str(get("status_code") or "Unset"),
        _to_str(str(get("status_message") or "")),
        *_events_and_links(doc, str_map),
    ]


def batch_token(entry_ids: list[bytes]) -> str:
    """The insert deduplication token of a batch: the same entry ids give the same token."""
    digest = hashlib.blake2b(b"\n".join(entry_ids), digest_size=16).hexdigest()
    return f"spans-{entry_ids[0].decode()}-{entry_ids[-1].decode()}-{len(entry_ids)}-{digest}"
