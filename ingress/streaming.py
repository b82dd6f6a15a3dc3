"""Server-sent events for ``stream: true``: OpenAI chunks as they arrive, then ``data: [DONE]``."""

from __future__ import annotations

from typing import Any

from ingress.errors import invalid_request
from ingress.http import Receive, Send
from runtime.producer import Producer
from runtime.wire.contract import ChatCall


async def send_stream(
    send: Send, receive: Receive, producer: Producer, call: ChatCall, **kwargs: Any
) -> None:
    raise invalid_request("stream: true is not supported yet", param="stream")
