"""Issue 19, section 5: a backend row's own settings are the ones used.

Real HTTP throughout: a listener that never accepts (its backlog full) stands for a backend that
cannot be reached, and a small aiohttp server records which API key each call carried.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from runtime.errors import BackendConnectError
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.keys import KeySpace
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import GroupConfig, PoolConfig
from tests.support.dispatching import CALL, running_dispatcher
from tests.support.key_recorder import KeyRecorder

SECRETS = {"KEY_A": "sk-group-default", "KEY_B": "sk-pool-own"}


@contextlib.contextmanager
def never_accepting() -> Iterator[str]:
    """A base URL whose server never accepts: its backlog is full, so a new connect hangs (the SYN is
    dropped) until the client's connect timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for sock in [*fillers, listener]:
            sock.close()


def two_backends(default_url: str, own_url: str, *, queueing: bool = True, **own: object) -> GroupConfig:
    """The group's default backend "a" (key KEY_A, 5 s connect timeout) and pool "p" on backend "b"."""
    default = BackendConfig("a", default_url, kind="openai", load_gating=False, api_key_env="KEY_A")
    pool_own = BackendConfig("b", own_url, kind="openai", load_gating=False, api_key_env="KEY_B", **own)  # type: ignore[arg-type]
    return GroupConfig(
        group_id="g",
        policy="fifo",
        total_concurrency=4,
        api_key_env="KEY_A",  # as published: the default backend's
        queueing_enabled=queueing,
        pools=(PoolConfig("p", max_concurrent=4, backend_id="b"), PoolConfig("other", max_concurrent=4)),
        version=1,
        backend_id="a",
        backends=(default, pool_own),
    )


async def test_direct_mode_uses_the_pools_backend_key_and_connect_timeout(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    """Before: the producer's direct mode sent the group default's key (KEY_A) and connected with the
    library default (5 s), whatever the pool's backend row said."""
    recorder = KeyRecorder()
    async with recorder.running():
        with never_accepting() as dead:
            await groups.publish(aredis, keys, two_backends(dead, recorder.url, queueing=False))
            async with Producer(aredis, keys=keys, secrets=SECRETS) as producer:
                await producer.submit(CALL, pool_id="p", timeout=10)
                assert recorder.keys == ["Bearer sk-pool-own"]
            # Now the pool's backend cannot be reached: its own connect timeout (0.3 s) applies.
            config = two_backends(recorder.url, dead, queueing=False, connect_timeout_s=0.3)
            await groups.publish(aredis, keys, config)
            async with Producer(aredis, keys=keys, secrets=SECRETS) as producer:
                started = time.monotonic()
                with pytest.raises(BackendConnectError, match=r"no connection within 0\.3s"):
                    await producer.submit(CALL, pool_id="p", timeout=10)
                assert time.monotonic() - started < 3.0


async def test_the_dispatcher_connects_with_the_backends_connect_timeout(
    aredis: aioredis.Redis, keys: KeySpace
) -> None:
    """Before: the row's connect_timeout_s was never used; the dispatcher's default (5 s) applied."""
    with never_accepting() as dead:
        config = two_backends("http://127.0.0.1:9/v1", dead, connect_timeout_s=0.3)
        async with running_dispatcher(aredis, keys, config, backend_connect_timeout_s=5.0) as dispatcher:
            backend = dispatcher.backends.get(dead, None)
            assert backend.connect_timeout_s == 5.0  # the pool's default, for a bare URL
            async with Producer(aredis, keys=keys, secrets=SECRETS) as producer:
                with pytest.raises(BackendConnectError, match=r"no connection within 0\.3s"):
                    await producer.submit(CALL, pool_id="p", timeout=10)


async def test_models_list_uses_the_pools_backend_key(aredis: aioredis.Redis, keys: KeySpace) -> None:
    """``GET /v1/models`` asks the backend of the key's pool. Before: with the group default's key."""
    from ingress.models_list import ModelLister

    recorder = KeyRecorder()
    async with recorder.running():
        await groups.publish(aredis, keys, two_backends("http://127.0.0.1:9/v1", recorder.url))
        async with Producer(aredis, keys=keys) as producer:
            listed = await ModelLister(secrets=SECRETS).list(producer, "p")
    assert listed == {"object": "list", "data": []}
    assert recorder.keys == ["Bearer sk-pool-own"]
