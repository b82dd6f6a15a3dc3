"""A backend's load, read from its Prometheus ``/metrics`` text (vLLM, SGLang, llama.cpp or TGI names).

Pure: :func:`parse_load` turns the body of one scrape into a :class:`BackendLoad`; fetching it is
the scraper's job (:mod:`runtime.backends.scraper`). Parsing uses ``prometheus_client``'s own parser,
so label sets, escaping and values are read as Prometheus reads them. A server with several
models (or data-parallel ranks) reports one sample per label set: they are summed, and the KV-cache
usage is the highest of them (the fullest engine is the one that queues first).

Not every server exports a KV-cache gauge: TGI has none, and llama.cpp's ``llama-server`` dropped
``llamacpp:kv_cache_usage_ratio`` in 2025 (older builds still send it). Such a load is gated on the
two request gauges alone, and says so (``kv_exported`` False).

A backend's ``/metrics`` is untrusted input. Only the lines of the three gauges reach the parser
(:class:`SampleLines` picks them out with a regular expression, chunk by chunk as the body arrives,
so a large body costs the event loop milliseconds, not seconds), and
every value is checked: not finite, negative or absurd values refuse the whole scrape with a reason
(:class:`MetricsRefused`); a KV-cache usage a rounding hair over 1 is clamped to 1.
:func:`load_problem` applies the same rules to a load read back from Valkey, so the gate never
computes with a value that did not pass them.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict

import orjson
from prometheus_client.parser import text_string_to_metric_families

from runtime.errors import MalformedEnvelope
from runtime.immutable import immutable

__all__ = [
    "MAX_REQUESTS",
    "MAX_SAMPLES",
    "METRIC_NAMES",
    "BackendLoad",
    "MetricNames",
    "MetricsRefused",
    "SampleLines",
    "gauges_read",
    "load_from_lines",
    "load_problem",
    "parse_load",
]

# More requests than any one server runs or queues: the exporter is broken, whatever it says.
MAX_REQUESTS = 1_000_000
# Samples of the load gauges (models x ranks x 3) in one scrape; more is a broken or hostile exporter.
MAX_SAMPLES = 1024
# Float rounding may report a full cache a hair over 1: clamped. Beyond this it is not a fraction.
KV_OVERSHOOT = 1.01


class MetricsRefused(ValueError):
    """The backend answered, but its metrics are unusable; the message says why."""


@immutable
class MetricNames:
    """The three gauges gating reads, under one serving engine's names. ``kv_usage`` lists the
    KV-cache gauge's names, current first: the first one the server exports is read. Without
    ``kv_required`` a body lacking all of them is read without a KV-cache usage."""

    running: str
    waiting: str
    kv_usage: tuple[str, ...]
    kv_required: bool = True

    def all(self) -> tuple[str, ...]:
        return (self.running, self.waiting, *self.kv_usage)


METRIC_NAMES: dict[str, MetricNames] = {
    # vLLM before 0.10 exports the KV-cache usage as vllm:gpu_cache_usage_perc.
    "vllm": MetricNames(
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    "sglang": MetricNames("sglang:num_running_reqs", "sglang:num_queue_reqs", ("sglang:token_usage",)),
    # llama-server (started with --metrics): slots busy, requests deferred for want of a free slot.
    "llamacpp": MetricNames(
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        ("llamacpp:kv_cache_usage_ratio",),
        kv_required=False,
    ),
    # TGI: the current batch runs, the queue waits; it exports no KV-cache usage.
    "tgi": MetricNames("tgi_batch_current_size", "tgi_queue_size", (), kv_required=False),
}

_CURRENT_KV_NAMES = frozenset({"", *(names.kv_usage[0] for names in METRIC_NAMES.values() if names.kv_usage)})

# A sample line is short (name, a few labels, a value); a longer "line" is not a sample of ours.
MAX_LINE = 64 * 1024

# Per kind: the sample lines of its gauges (name, then labels or a blank), found without parsing.
_SAMPLE_LINES = {
    kind: re.compile(
        rb"^(?:%s)[{ \t][^\n]*" % b"|".join(re.escape(n.encode()) for n in names.all()), re.MULTILINE
    )
    for kind, names in METRIC_NAMES.items()
}


class SampleLines:
    """Picks the sample lines of one kind's load gauges out of a body fed in chunks.

    The work per :meth:`feed` is bounded by the chunk (a line longer than :data:`MAX_LINE` is skipped,
    never rescanned), so a scraper feeding chunks as they arrive never holds its loop for long."""

    def __init__(self, kind: str) -> None:
        names = METRIC_NAMES.get(kind)
        if names is None:
            raise ValueError(
                f"backend kind {kind!r} exports no load metrics (known: {', '.join(METRIC_NAMES)})"
            )
        self.kind = kind
        self.names = names
        self.lines: list[bytes] = []
        self._pattern = _SAMPLE_LINES[kind]
        self._tail = b""
        self._skipping = False  # inside an overlong line: drop bytes up to its end

    def feed(self, chunk: bytes) -> None:
        if self._skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return
            chunk, self._skipping = chunk[end + 1 :], False
        data = self._tail + chunk
        cut = data.rfind(b"\n") + 1
        self._tail = data[cut:]
        if cut:
            self._take(data[:cut])
        if len(self._tail) > MAX_LINE:
            if self._pattern.match(self._tail):
                raise MetricsRefused(f"a sample line of the load gauges is over {MAX_LINE} bytes long")
            self._tail, self._skipping = b"", True

    def finish(self) -> list[str]:
        """The sample lines found, once the whole body was fed."""
        if self._tail and not self._skipping:
            self._take(self._tail)
        self._tail = b""
        return [line.decode("utf-8", errors="replace") for line in self.lines]

    def _take(self, complete: bytes) -> None:
        self.lines.extend(self._pattern.findall(complete))
        if len(self.lines) > MAX_SAMPLES:
            raise MetricsRefused(f"the metrics hold over {MAX_SAMPLES} samples of the load gauges (absurd)")


@immutable
class BackendLoad:
    """One scrape of one backend, as shared through Valkey.

    ``scraped_at`` is wall-clock seconds (every process of the fleet compares it with its own clock).
    ``in_flight_at_scrape`` is how many of our calls were in flight to the backend when the metrics
    were read: the gate counts launches made since then as already waiting. ``error`` is empty when
    the scrape succeeded; a failed scrape keeps the time so the dashboard can say since when.
    ``refused`` tells a backend that answered with unusable metrics from one that did not answer.
    ``kv_metric`` is the gauge the KV-cache usage was read from (an older server's name shows here);
    ``kv_exported`` is False when the server sent no KV-cache gauge (``kv_usage`` is then 0, unknown).
    """

    backend_id: str
    scraped_at: float
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    in_flight_at_scrape: int = 0
    error: str = ""
    scrape_ms: float = 0.0
    refused: bool = False
    kv_metric: str = ""
    kv_exported: bool = True

    @property
    def ok(self) -> bool:
        return not self.error

    def encode(self) -> bytes:
        # The fields added by issue 19 are left out at their usual values: a dispatcher of the previous
        # release (during a rolling upgrade) then reads the load as before; it cannot read a refused
        # one or an older server's KV gauge, and falls back to max_in_flight, as it did for those.
        fields = asdict(self)
        if not self.refused:
            del fields["refused"]
        if self.kv_metric in _CURRENT_KV_NAMES:
            del fields["kv_metric"]
        if self.kv_exported:
            del fields["kv_exported"]
        return orjson.dumps(fields)

    @classmethod
    def decode(cls, raw: bytes | str) -> BackendLoad:
        try:
            return cls(**orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise MalformedEnvelope(f"shared backend load is unreadable: {exc}") from exc


def parse_load(text: str | bytes, *, kind: str, backend_id: str, scraped_at: float) -> BackendLoad:
    """The load in one whole ``/metrics`` body; see :func:`load_from_lines`."""
    lines = SampleLines(kind)
    lines.feed(text.encode() if isinstance(text, str) else text)
    return load_from_lines(lines, backend_id=backend_id, scraped_at=scraped_at)


def load_from_lines(lines: SampleLines, *, backend_id: str, scraped_at: float) -> BackendLoad:
    """The load in the sample lines picked out of a body; raises :class:`MetricsRefused` (a ValueError)
    with the reason when the body lacks the kind's gauges or a value is not finite, negative or absurd."""
    names = lines.names
    found: dict[str, list[float]] = {name: [] for name in names.all()}
    try:
        for family in text_string_to_metric_families("\n".join(lines.finish()) + "\n"):
            for sample in family.samples:
                if sample.name in found:
                    found[sample.name].append(_checked(sample.name, float(sample.value)))
    except MetricsRefused:
        raise
    except ValueError as exc:
        raise MetricsRefused(f"unreadable Prometheus text: {exc}") from exc
    kv_name = next((name for name in names.kv_usage if found[name]), "")
    needed = [names.running, names.waiting]
    if names.kv_required:
        needed.append(kv_name or names.kv_usage[0])
    missing = [name for name in needed if not found[name]]
    if missing:
        raise MetricsRefused(
            f"the metrics lack {', '.join(missing)} (is the backend kind {lines.kind!r} right?)"
        )
    kv_usage = max(found[kv_name]) if kv_name else 0.0
    if kv_usage > KV_OVERSHOOT:
        raise MetricsRefused(f"{kv_name} is {kv_usage:g}, but a KV-cache usage is a fraction (0 to 1)")
    return BackendLoad(
        backend_id=backend_id,
        scraped_at=scraped_at,
        running=_count(names.running, found[names.running]),
        waiting=_count(names.waiting, found[names.waiting]),
        kv_usage=min(1.0, kv_usage),
        kv_metric=kv_name,
        kv_exported=bool(kv_name),
    )


def gauges_read(lines: SampleLines) -> list[str]:
    """The load gauges present in the sample lines picked out (after :meth:`SampleLines.finish`)."""
    present = {line.split(b"{", 1)[0].split(None, 1)[0].decode() for line in lines.lines if line.strip()}
    return [name for name in lines.names.all() if name in present]


def _checked(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise MetricsRefused(f"{name} is {value:g} (not a finite number)")
    if value < 0:
        raise MetricsRefused(f"{name} is {value:g} (negative)")
    return value


def _count(name: str, values: list[float]) -> int:
    total = sum(values)
    if total > MAX_REQUESTS:
        raise MetricsRefused(f"{name} adds up to {total:g} requests (absurd: over {MAX_REQUESTS})")
    return round(total)


def load_problem(load: BackendLoad) -> str | None:
    """Why a successful load (as read back from Valkey, so of any shape) must not be used, or None.

    The same bounds as :func:`parse_load`'s, and the types, which JSON does not keep (``NaN`` is
    written as ``null``)."""
    for name in ("running", "waiting", "in_flight_at_scrape"):
        value = getattr(load, name)
        if type(value) is not int or not 0 <= value <= MAX_REQUESTS:
            return f"the shared load's {name} is {value!r}, not a count"
    kv = load.kv_usage
    if not _is_number(kv) or not 0 <= kv <= 1:
        return f"the shared load's kv_usage is {kv!r}, not a fraction"
    if not _is_number(load.scraped_at) or not math.isfinite(load.scraped_at):
        return f"the shared load's scraped_at is {load.scraped_at!r}, not a time"
    if type(load.kv_exported) is not bool:
        return f"the shared load's kv_exported is {load.kv_exported!r}, not a yes or no"
    return None


def _is_number(value: object) -> bool:
    return type(value) in (int, float)
