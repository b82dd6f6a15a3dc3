"""With Valkey down the ingress answers 503 (the SDK's InternalServerError), before and after start-up.

The ingress app runs in-process behind httpx's ASGI transport, with its real producer talking to a
private Valkey that the test really stops; key lookups come from a fixed grant (the database is not
what is under test here).
"""

from __future__ import annotations

import httpx
import openai
import pytest

from ingress.app import Ingress
from ingress.grants import GrantCache
from ingress.models_list import ModelLister
from ingress.selectors import KeyGrant
from runtime.producer import Producer
from runtime.queue.keys import KeySpace
from runtime.valkey import embedded
from runtime.valkey.client import connect

GRANT = KeyGrant(1, "alice", frozenset({"gold"}), "gold", None, None)
HELLO = [{"role": "user", "content": "Hello"}]


async def fixed_grant(raw_key: str) -> KeyGrant | None:
    return GRANT if raw_key == "good" else None


async def nothing(key_id: int) -> None:
    return None


def ingress_for(url: str) -> Ingress:
    return Ingress(
        make_producer=lambda: Producer(connect(url), keys=KeySpace("t-down:")),
        grants=GrantCache(fixed_grant),
        models=ModelLister(),
        mark_used=nothing,
        max_body_bytes=1024 * 1024,
        default_timeout_s=5,
    )


def sdk(app: Ingress) -> openai.AsyncOpenAI:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    return openai.AsyncOpenAI(
        base_url="http://ingress.test/v1",
        api_key="good",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport),
    )


@pytest.mark.parametrize("started_first", [False, True], ids=["down-at-start", "down-later"])
async def test_valkey_down_is_a_503(private_valkey: embedded.EmbeddedValkey, started_first: bool) -> None:
    app = ingress_for(private_valkey.url)
    try:
        if started_first:
            await app.producer()
        embedded.stop(private_valkey.data_dir)
        with pytest.raises(openai.InternalServerError) as caught:
            await sdk(app).chat.completions.create(model="m", messages=HELLO)  # type: ignore[arg-type]
        assert caught.value.status_code == 503
        assert caught.value.code == "queue_unavailable"
    finally:
        await app.aclose()
