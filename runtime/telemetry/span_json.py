"""A finished span as the span stream carries it: one compact JSON document, credentials scrubbed.

The format is the history ingester's (``history.spans``) and the Collector ClickHouse exporter's
spellings; :func:`encode_span` runs once per span in the export thread of every process that traces.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from runtime.backends.redact import redact_url, url_has_credentials

SPAN_FORMAT_VERSION = 1

# Collector ClickHouse exporter spellings (pdata's SpanKind / StatusCode names).
_KIND_NAMES = {
    trace.SpanKind.INTERNAL: "Internal",
    trace.SpanKind.SERVER: "Server",
    trace.SpanKind.CLIENT: "Client",
    trace.SpanKind.PRODUCER: "Producer",
    trace.SpanKind.CONSUMER: "Consumer",
}
_STATUS_NAMES = {
    trace.StatusCode.UNSET: "Unset",
    trace.StatusCode.OK: "Ok",
    trace.StatusCode.ERROR: "Error",
}

_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def scrub_text(value: str) -> str:
    """Every URL inside ``value`` that carries credentials, redacted (userinfo and secret params)."""
    if "://" not in value:
        return value

    def _one(match: re.Match[str]) -> str:
        url = match.group(0)
        return redact_url(url) if url_has_credentials(url) else url

    return _URL_RE.sub(_one, value)


def scrub_value(value: Any) -> Any:
    """Attribute value with credential-bearing URLs redacted (strings and sequences of strings)."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, list | tuple):
        return [scrub_value(item) for item in value]
    return value


def _attrs(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Attributes as the span's JSON carries them: sequences as lists, credential URLs redacted."""
    out: dict[str, Any] = {}
    if not attributes:
        return out
    for key, value in attributes.items():
        kind = type(value)
        # Most values are plain scalars: taken as they are, without scrub_value's checks (a span
        # holds ~23 attributes, and this runs once per span in the export thread).
        if kind is str:
            out[str(key)] = scrub_text(value) if "://" in value else value
        elif kind is int or kind is float or kind is bool:
            out[str(key)] = value
        else:
            out[str(key)] = scrub_value(list(value) if isinstance(value, tuple) else value)
    return out


class _ResourceDocs:
    """The resource's attributes as JSON values, worked out once per resource object: every span of a
    provider has the same, immutable resource. One entry, replaced when another resource comes."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[Resource | None, dict[str, Any]] = (None, {})

    def of(self, resource: Resource | None) -> dict[str, Any]:
        last = self._last  # one read: another exporter's thread may replace it meanwhile
        if resource is None:
            return {}
        if last[0] is not resource:
            last = self._last = (resource, _attrs(resource.attributes))
        return last[1]


_resource_docs = _ResourceDocs()


def _hex_span_id(span_id: int | None) -> str:
    return format(span_id, "016x") if span_id else ""


def encode_span(span: ReadableSpan) -> bytes:
    """One span as the compact JSON the ingester stores (ids as lowercase hex, times in ns)."""
    ctx = span.get_span_context()
    parent = span.parent
    scope = span.instrumentation_scope
    doc = {
        "v": SPAN_FORMAT_VERSION,
        "trace_id": format(ctx.trace_id, "032x") if ctx else "",
        "span_id": _hex_span_id(ctx.span_id if ctx else None),
        "parent_span_id": _hex_span_id(parent.span_id if parent else None),
        "trace_state": ctx.trace_state.to_header() if ctx and ctx.trace_state else "",
        "name": span.name,
        "kind": _KIND_NAMES.get(span.kind, "Internal"),
        "start_ns": span.start_time or 0,
        "end_ns": span.end_time or span.start_time or 0,
        "status_code": _STATUS_NAMES.get(span.status.status_code, "Unset"),
        "status_message": scrub_text(span.status.description or ""),
        "attributes": _attrs(span.attributes),
        "resource": _resource_docs.of(span.resource),
        "scope": {"name": scope.name if scope else "", "version": (scope.version or "") if scope else ""},
        "events": [
            {"ts_ns": ev.timestamp, "name": ev.name, "attributes": _attrs(ev.attributes)}
            for ev in span.events
        ],
        "links": [
            {
                "trace_id": format(link.context.trace_id, "032x"),
                "span_id": _hex_span_id(link.context.span_id),
                "trace_state": link.context.trace_state.to_header() if link.context.trace_state else "",
                "attributes": _attrs(link.attributes),
            }
            for link in span.links
        ],
    }
    return orjson.dumps(doc)
