"""Sends one path prefix to its own ASGI app and everything else to the default one."""

from __future__ import annotations

from typing import Any

from ingress.http import Receive, Scope, Send


class PathPrefixRouter:
    def __init__(self, prefix: str, app: Any, default: Any) -> None:
        self.prefix = prefix
        self.app = app
        self.default = default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
        else:
            await self.default(scope, receive, send)
