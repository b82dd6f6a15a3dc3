"""One look at a backend for the admin's "test connection": its models and its load, read once.

:func:`probe` fetches ``/v1/models`` with the backend's key and, for a kind with load metrics, its
``/metrics`` as the scraper does (no key, :func:`~runtime.backends.scraper.read_bounded`: a total
time budget, a size cap, the body filtered chunk by chunk), then says what it read: the models, the
load gauges found, the load parsed, or why not. A backend is untrusted input here as in the scraper:
whatever it answers (garbage, a drip, a huge body, a redirect), the result says so and nothing raises.
"""

from __future__ import annotations

import dataclasses
import time

import httpx
import orjson

from runtime.backends.metrics import BackendLoad, MetricsRefused, SampleLines, gauges_read, load_from_lines
from runtime.backends.redact import redact_url
from runtime.backends.scraper import failure_words, read_bounded
from runtime.immutable import immutable
from runtime.wire.backendconfig import BackendConfig

__all__ = ["MODELS_MAX_BYTES", "MODELS_SHOWN", "ProbeResult", "models_url", "probe"]

# A model list is a few KB; a larger answer is not one (or not one worth showing).
MODELS_MAX_BYTES = 1 << 20
# The models fetch may be slower than a scrape (a hosted API), but the admin's page waits for it.
MODELS_BUDGET_S = 5.0
# Model ids shown at most (a hosted API may list hundreds).
MODELS_SHOWN = 50


@immutable
class ProbeResult:
    """What one look at a backend read. ``models_error`` / ``metrics_error`` are empty when that part
    was read; ``metrics_refused`` tells unusable metrics from no answer; ``load`` is the parsed load."""

    models_url: str  # redacted
    models: tuple[str, ...] = ()
    models_total: int = 0
    models_error: str = ""
    models_ms: float = 0.0
    metrics_url: str = ""  # redacted; empty for a kind without load metrics
    gauges: tuple[str, ...] = ()
    load: BackendLoad | None = None
    metrics_error: str = ""
    metrics_refused: bool = False
    metrics_ms: float = 0.0
    key_sent: bool = False

    @property
    def ok(self) -> bool:
        return not self.models_error and not self.metrics_error


def models_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/models"


async def probe(
    backend: BackendConfig, *, api_key: str | None, http: httpx.AsyncClient | None = None
) -> ProbeResult:
    """Reads the backend's models and (for a kind with metrics) its load once; never raises for
    anything the backend does."""
    client = http or httpx.AsyncClient(follow_redirects=False)
    try:
        models = await _models(client, backend, api_key)
        if backend.kind == "openai":
            return models
        return await _metrics(client, backend, models)
    finally:
        if http is None:
            await client.aclose()


async def _models(client: httpx.AsyncClient, backend: BackendConfig, api_key: str | None) -> ProbeResult:
    url = models_url(backend.base_url)
    body = bytearray()
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    budget = min(MODELS_BUDGET_S, backend.timeout_s)
    started = time.perf_counter()
    ids: list[str] = []
    error = ""
    try:
        await read_bounded(
            client, url, budget_s=budget, connect_s=backend.connect_timeout_s, cap=MODELS_MAX_BYTES,
            feed=body.extend, what="models", headers=headers,
        )  # fmt: skip
        ids = model_ids(bytes(body))
    except (TimeoutError, httpx.HTTPError, ValueError) as exc:
        error, _ = failure_words(exc, url, budget_s=budget, what="models")
    return ProbeResult(
        models_url=redact_url(url),
        models=tuple(ids[:MODELS_SHOWN]),
        models_total=len(ids),
        models_error=error,
        models_ms=_ms_since(started),
        key_sent=bool(api_key),
    )


def model_ids(body: bytes) -> list[str]:
    """The model ids of an OpenAI ``/v1/models`` answer; raises MetricsRefused (a ValueError) saying
    what is wrong with any other body."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MetricsRefused(f"the models answer is not JSON ({len(body)} bytes)") from None
    data = parsed.get("data") if isinstance(parsed, dict) else None
    if not isinstance(data, list):
        raise MetricsRefused('the models answer has no "data" list (is the base URL the /v1 one?)')
    return [str(m["id"])[:200] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


async def _metrics(client: httpx.AsyncClient, backend: BackendConfig, found: ProbeResult) -> ProbeResult:
    url = backend.scrape_url()
    lines = SampleLines(backend.kind)
    started = time.perf_counter()
    load, error, refused = None, "", False
    try:
        await read_bounded(
            client, url, budget_s=backend.metrics_timeout_s, connect_s=backend.connect_timeout_s,
            cap=backend.metrics_max_bytes, feed=lines.feed, what="metrics",
        )  # fmt: skip
        load = load_from_lines(lines, backend_id=backend.backend_id, scraped_at=time.time())
    except (TimeoutError, httpx.HTTPError, ValueError) as exc:
        error, refused = failure_words(exc, url, budget_s=backend.metrics_timeout_s, what="metrics")
    return dataclasses.replace(
        found,
        metrics_url=redact_url(url),
        gauges=tuple(gauges_read(lines)),
        load=load,
        metrics_error=error,
        metrics_refused=refused,
        metrics_ms=_ms_since(started),
    )


def _ms_since(started: float) -> float:
    return round(1000 * (time.perf_counter() - started), 1)
