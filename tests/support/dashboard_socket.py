"""The dashboard websocket as a browser opens it, and waiting for a view that matches."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from dashboard.routing import websocket_urlpatterns


def communicator(user: Any, group_id: str = "g") -> WebsocketCommunicator:
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/fabric/{group_id}/")
    comm.scope["user"] = user
    return comm


async def view_where(comm: WebsocketCommunicator, predicate: Callable[[dict], bool], timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        message = await comm.receive_json_from(timeout=max(0.1, deadline - time.monotonic()))
        assert message["type"] == "fabric.view"
        seen = message["view"]
        if predicate(seen):
            return seen
    raise AssertionError(f"no matching view in time; last: {seen}")
