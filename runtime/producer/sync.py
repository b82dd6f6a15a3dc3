"""A blocking facade over :class:`~runtime.producer.core.Producer` for code that is not async."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from runtime import eventloop
from runtime.config import ProducerSettings
from runtime.producer.core import Producer
from runtime.producer.outcomes import CompletionResult
from runtime.valkey.client import connect
from runtime.wire.contract import Call, CompletionsCall, EmbeddingsCall

__all__ = ["SyncProducer"]

_T = TypeVar("_T")


class SyncProducer:
    """A blocking facade over :class:`Producer` for code that is not async.

    It runs its own event loop in a daemon thread; ``submit`` may be called from any thread.
    """

    def __init__(self, url: str, **producer_kwargs: Any) -> None:
        self._loop = eventloop.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="llm-dispatch-producer", daemon=True
        )
        self._thread.start()
        settings = producer_kwargs.get("settings") or ProducerSettings()
        self._client = connect(url, health_s=settings.valkey_health_s)
        self.producer = Producer(self._client, **producer_kwargs)
        self._run(self.producer.start())

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop ``producer`` runs on, in its own thread: for many calls at once
        (``asyncio.run_coroutine_threadsafe(sync.producer.submit(...), sync.loop)``)."""
        return self._loop

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, call: Call | Mapping[str, Any], **kwargs: Any) -> CompletionResult:
        return self._run(self.producer.submit(call, **kwargs))

    def embed(self, call: EmbeddingsCall | Mapping[str, Any], **kwargs: Any) -> CompletionResult:
        return self._run(self.producer.embed(call, **kwargs))

    def complete(self, call: CompletionsCall | Mapping[str, Any], **kwargs: Any) -> CompletionResult:
        return self._run(self.producer.complete(call, **kwargs))

    def close(self) -> None:
        self._run(self.producer.close())
        self._run(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
