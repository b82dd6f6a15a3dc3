"""The direct path: a pool whose group has queueing disabled is called at its endpoint, no queue.

It returns the same :class:`~runtime.producer.outcomes.CompletionResult` shape as the queued path
(zero queue wait) and raises the same typed errors. An ingress key's most-in-flight is counted per
process here: nothing is queued, so nothing is shared.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator, Mapping

from runtime.backends.adapter import BackendPool, OpenAIBackend
from runtime.errors import QueueFull
from runtime.policy.admission import REASON_KEY_IN_FLIGHT, KeyLimits
from runtime.producer.outcomes import CompletionResult
from runtime.wire.contract import Call, Timing
from runtime.wire.groupconfig import GroupConfig

__all__ = ["DirectPath"]


class DirectPath:
    """The backends a producer calls itself, and each ingress key's calls open on them."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self.secrets = dict(secrets)
        self.backends: BackendPool | None = None
        self._open: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"<DirectPath open={sum(self._open.values())}>"

    def backend(self, group: GroupConfig, pool_id: str) -> OpenAIBackend:
        """The backend serving ``pool_id`` of a group with queueing disabled, with the group's API key
        found in ``secrets``."""
        if self.backends is None:
            self.backends = BackendPool()
        key_env = group.api_key_env_for(pool_id)
        api_key = self.secrets.get(key_env) if key_env else None
        route = group.route(pool_id)
        if route.backend is None:
            return self.backends.get(route.endpoint, api_key)
        return self.backends.get(
            route.endpoint,
            api_key,
            timeout_s=route.backend.timeout_s,
            connect_timeout_s=route.backend.connect_timeout_s,
        )

    @contextlib.contextmanager
    def slot(self, key: KeyLimits | None, pool_id: str) -> Iterator[None]:
        """A key's most-in-flight on the direct path (no queue: nothing is queued, nothing shared)."""
        if key is None or key.max_in_flight is None:
            yield
            return
        open_now = self._open[key.key_id]
        if open_now >= key.max_in_flight:
            raise QueueFull(
                key.describe(REASON_KEY_IN_FLIGHT, open_now), pool_id=pool_id, reason=REASON_KEY_IN_FLIGHT,
                depth=open_now, limit=float(key.max_in_flight),
            )  # fmt: skip
        self._open[key.key_id] += 1
        try:
            yield
        finally:
            self._open[key.key_id] -= 1

    async def complete(
        self, backend: OpenAIBackend, chat: Call, request_id: str, pool_id: str, timeout_s: float
    ) -> CompletionResult:
        started = time.monotonic()
        completion = await backend.complete(chat.to_openai(), timeout_s=timeout_s, endpoint=chat.endpoint)
        elapsed = time.monotonic() - started
        return CompletionResult(request_id, pool_id, completion.body, Timing(0.0, elapsed, elapsed))

    async def aclose(self) -> None:
        if self.backends is not None:
            await self.backends.aclose()
