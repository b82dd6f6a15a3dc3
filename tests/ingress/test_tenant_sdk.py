"""Two producer keys in one fair pool through the real openai SDK, daphne, dispatcher and simulator
processes (issue 22): each key is a tenant; the quiet key is not queued behind the noisy one."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.support.ingress_stack import Stack
from tests.support.waiting import wait_until_sync

pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Hello"}]
POOL = "solo"  # one slot: every call waits for the one before it


def make_fair(stack: Stack, *, sub_tenants: str) -> None:
    stack.manage(
        "shell", "-c",
        f"from pools import services; from pools.models import Pool; from ingress.models import ProducerKey; "
        f"pool = Pool.objects.get(pool_id={POOL!r}); pool.tenant_fairness = 'tokens'; "
        f"services.pool_save(pool=pool); "
        f"ProducerKey.objects.filter(name={sub_tenants!r}).update(allow_sub_tenant=True)",
    )  # fmt: skip


def key_id(stack: Stack, name: str) -> int:
    code = f"from ingress.models import ProducerKey; print(ProducerKey.objects.get(name={name!r}).pk)"
    return int(stack.manage("shell", "-c", code).strip().splitlines()[-1])


def client(stack: Stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_two_keys_share_one_fair_pool(stack: Stack) -> None:
    noisy_key = stack.create_key("noisy", POOL)
    quiet_key = stack.create_key("quiet", POOL)
    make_fair(stack, sub_tenants="quiet")
    noisy_tenant = f"key-{key_id(stack, 'noisy')}"
    order: list[str] = []
    lock = threading.Lock()

    def call(key: str, who: str, **extra: object) -> None:
        # max_tokens near what the simulator answers, so the launch estimate is close to the usage:
        # with the pool's default (256 output tokens, ~1,000 weighted) against ~16 used, the quiet key
        # enters at the noisy key's counter while a noisy call is in flight, charged its estimate;
        # the correction then puts the noisy key ~14 of its small calls below it.
        client(stack, key).chat.completions.create(
            model="sim-model",
            messages=HELLO,
            max_tokens=16,
            extra_body={"sim": {"latency_ms": 150}},
            **extra,  # type: ignore[arg-type]
        )
        with lock:
            order.append(who)

    with stack.valkey() as valkey, ThreadPoolExecutor(16) as pool:
        noisy = [pool.submit(call, noisy_key, "noisy") for _ in range(12)]
        tenant_list = stack.keys.tenant_requests(POOL, noisy_tenant)
        wait_until_sync(lambda: valkey.llen(tenant_list) >= 8, 20, what="the noisy key's backlog")
        quiet = pool.submit(call, quiet_key, "quiet", user="carol")
        quiet.result(30)
        with lock:
            # The noisy calls answered before the quiet one: its place in the order, not a count taken
            # after this thread woke (a busy machine lets more noisy answers land meanwhile).
            noisy_before = order.index("quiet")
        for done in noisy:
            done.result(60)
        assert valkey.zcard(stack.keys.tenants(POOL)) == 0
        assert int(valkey.get(stack.keys.pool_queued(POOL))) == 0
        served = valkey.hgetall(stack.keys.tenant_served(POOL))
    # The quiet key waited for the slot and the call on it, not for the noisy key's backlog of 8+.
    assert noisy_before <= 4, order
    assert f"key-{key_id(stack, 'quiet')}:carol".encode() in served  # its sub-tenant, from `user`
