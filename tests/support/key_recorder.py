"""A small real OpenAI-compatible server that notes the API key of every call it answers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import orjson
from aiohttp import web


class KeyRecorder:
    """An OpenAI-compatible server that answers every call and ``/v1/models``, noting each key seen."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.url = ""

    async def _chat(self, request: web.Request) -> web.Response:
        self.keys.append(request.headers.get("authorization", ""))
        answer = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        body = {"id": "c", "object": "chat.completion", "model": "m", "choices": [answer]}
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        self.keys.append(request.headers.get("authorization", ""))
        return web.Response(body=b'{"object":"list","data":[]}', content_type="application/json")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[KeyRecorder]:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        try:
            yield self
        finally:
            await runner.cleanup()
