"""A producer key's limits hold over every web process, and ingress refusals and withdrawals reach history.

Two (or three) real daphne processes serve the same key; the real openai SDK with its default settings
(two retries) calls them. The key's most-in-flight and most-queued are counted in Valkey with the push,
so N web processes do not allow N times the limit, and a killed web process leaks its key's count for
one liveness TTL at most. The web processes write spans like any producer: a history ingester in this
test reads them from the span stream into a real chDB.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from history import queries, schema
from history.client import client_for, close_all
from history.ingester import Ingester
from tests.support.ingress_stack import Stack, start_stack
from tests.support.waiting import wait_until_sync

pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Hello"}]
ALIVE_TTL_S = 3.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, valkey_url: str) -> Iterator[Stack]:
    """The ingress stack with a second web process (``stack.env["WEB2"]``); spans stay in the stream
    for this test's own ingester (no web process owns a history database), liveness TTL short."""
    env = {
        "CLICKHOUSE_URL": "http://127.0.0.1:9/",
        "DISPATCH_PRODUCER_ALIVE_TTL_S": str(ALIVE_TTL_S),
        "DISPATCH_PRODUCER_ALIVE_REFRESH_S": "0.5",
    }
    root = Path(tmp_path_factory.mktemp("ingress-keys"))
    running = start_stack(root, valkey_url, f"t{uuid.uuid4().hex[:10]}:", env=env)
    try:
        running.env["WEB2"] = running.start_web("daphne2")[0]
        yield running
    finally:
        running.stop()


def sdk(url: str, key: str, **options: Any) -> openai.OpenAI:
    """The SDK as a client makes it: default retries."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, **options)


def slow_call(api: openai.OpenAI, latency_ms: int, pool: str = "gold") -> Callable[[], Any]:
    return lambda: api.chat.completions.create(
        model="m", messages=HELLO,  # type: ignore[arg-type]
        extra_body={"sim": {"latency_ms": latency_ms}}, extra_headers={"X-Dispatch-Pool": pool},
    )  # fmt: skip


_key_ids: dict[str, str] = {}


def open_requests(stack: Stack, key_name: str) -> int:
    """The key's open requests as the fleet counts them: its unexpired leases in Valkey."""
    if key_name not in _key_ids:
        query = f"from ingress.models import ProducerKey as K; print(K.objects.get(name={key_name!r}).pk)"
        _key_ids[key_name] = stack.manage("shell", "-c", query).strip().splitlines()[-1]
    with stack.valkey() as client:
        seconds, micros = client.time()
        # Expired leases are pruned by the next admission; until then they no longer count.
        return int(
            client.zcount(stack.keys.key_open(_key_ids[key_name]), f"({seconds + micros / 1e6}", "+inf")
        )


def refused(api: openai.OpenAI, pool: str = "gold") -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as caught:
        api.chat.completions.create(
            model="m",
            messages=HELLO,
            extra_headers={"X-Dispatch-Pool": pool},  # type: ignore[arg-type]
        )
    return caught.value


def test_most_in_flight_holds_across_two_web_processes(stack: Stack) -> None:
    key = stack.create_key("two-open", "gold", "--max-in-flight", "2")
    web1, web2 = sdk(stack.url, key), sdk(stack.env["WEB2"], key)
    with ThreadPoolExecutor(2) as threads:
        # One open request in each web process: the key's two, though each process holds only one.
        calls: list[Future[Any]] = [threads.submit(slow_call(api, 8000)) for api in (web1, web2)]
        wait_until_sync(lambda: stack.sim_running() >= 2, 15, what="both calls running")
        error = refused(web1)
        assert [f.result().choices for f in calls]
    assert error.code == "too_many_in_flight" and error.response.headers["retry-after"] == "1"
    assert "'two-open' has 2 requests open" in error.message and "max_in_flight" in error.message
    # Every finished request gave its place back.
    assert open_requests(stack, "two-open") == 0
    assert web2.chat.completions.create(model="m", messages=HELLO).choices  # type: ignore[arg-type]


def test_most_queued_holds_across_two_web_processes(stack: Stack) -> None:
    key = stack.create_key("one-queued", "solo", "--max-queued", "1")
    web1, web2 = sdk(stack.url, key), sdk(stack.env["WEB2"], key)
    with ThreadPoolExecutor(2) as threads:
        running = threads.submit(slow_call(web1, 6000, "solo"))
        wait_until_sync(lambda: stack.sim_running() >= 1, 15, what="the first call running")
        # Pool solo runs one call at a time: this one waits in the queue (the key's one queued).
        queued = threads.submit(slow_call(web2, 10, "solo"))
        wait_until_sync(lambda: stack.queued("solo") >= 1, 15, what="the second call queued")
        error = refused(web1, "solo")
        assert running.result().choices and queued.result().choices
    assert error.code == "too_many_queued"
    assert "'one-queued' has 1 requests queued" in error.message and "max_queued" in error.message
    assert open_requests(stack, "one-queued") == 0


def test_a_killed_web_process_leaks_its_keys_count_for_one_ttl_at_most(stack: Stack) -> None:
    key = stack.create_key("orphaned", "gold", "--max-in-flight", "1")
    url, doomed = stack.start_web("daphne-doomed")
    api = sdk(stack.url, key)
    # Both web processes ready for this key (grant read, producer started): a first call costs a fresh
    # process seconds of CPU, which on a busy machine outlasted both the admission wait and the lease.
    for ready in (sdk(url, key), api):
        assert ready.models.list().data
    # Reads the key's id through `manage.py shell` (seconds of start-up) now, not inside the wait below.
    assert open_requests(stack, "orphaned") == 0
    with ThreadPoolExecutor(1) as threads:
        threads.submit(slow_call(sdk(url, key, max_retries=0), 20000))
        wait_until_sync(lambda: open_requests(stack, "orphaned") == 1, 15, what="the call admitted")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        killed_at = time.monotonic()
        # One attempt: the SDK's retries of a 429 wait a second each, and the lease has one TTL to live.
        refusal = refused(sdk(stack.url, key, max_retries=0))
        assert refusal.code == "too_many_in_flight"  # the dead process's request still counts...
        # ...until its lease, no longer renewed, runs out: then the key is free again.
        wait_until_sync(lambda: open_requests(stack, "orphaned") == 0, 3 * ALIVE_TTL_S, what="lease expired")
        assert time.monotonic() - killed_at <= 2 * ALIVE_TTL_S
        assert api.chat.completions.create(model="m", messages=HELLO).choices  # type: ignore[arg-type]


def test_refusals_and_withdrawals_are_in_history(stack: Stack, tmp_path: Path) -> None:
    key = stack.create_key("watched", "gold,iron", "--max-in-flight", "1")
    api = sdk(stack.url, key)
    with ThreadPoolExecutor(1) as threads:
        running = threads.submit(slow_call(api, 8000))  # outlasts the SDK's two retries of the 429
        wait_until_sync(lambda: stack.sim_running() >= 1, 15, what="the call running")
        refused(api)
        assert running.result().choices
    stack.set_paused(True, "iron")
    try:
        # The client gives up (three times: the SDK retries a timeout) while its request waits in the
        # paused pool: withdrawn, never run.
        with pytest.raises(openai.APITimeoutError):
            sdk(stack.url, key, timeout=1.0).chat.completions.create(
                model="m",
                messages=HELLO,
                extra_headers={"X-Dispatch-Pool": "iron"},  # type: ignore[arg-type]
            )
        wait_until_sync(lambda: open_requests(stack, "watched") == 0, 10, what="the withdrawn call released")
    finally:
        stack.set_paused(False, "iron")
    statuses = history_statuses(stack, tmp_path, "watched", want={"rejected", "dropped", "ok"})
    assert set(statuses["rejected"]) == {("queue_full", "key_max_in_flight")}
    assert set(statuses["dropped"]) == {("cancelled", "cancelled")}


def history_statuses(
    stack: Stack, tmp_path: Path, producer: str, want: set[str]
) -> dict[str, list[tuple[str, str]]]:
    """The key's history rows by status: (error type, drop reason), once every wanted status is there."""
    history = client_for(f"chdb://{tmp_path / 'clickhouse'}")
    schema.migrate(history, retention_days=30)
    try:
        with redis.Redis.from_url(stack.valkey_url) as client:
            ingester = Ingester(client, history, keys=stack.keys, block_ms=50, batch_size=500)
            found: dict[str, list[tuple[str, str]]] = {}

            def read() -> bool:
                ingester.step()
                rows = queries.executions_recent(
                    client=history, filters=queries.ExecutionFilter(producer=producer)
                ).rows
                found.clear()
                for row in rows:
                    found.setdefault(row["status"], []).append((row["error_type"], row["drop_reason"]))
                return want <= set(found)

            wait_until_sync(read, 20, what=f"history rows {sorted(want)}")
            return found
    finally:
        close_all()
