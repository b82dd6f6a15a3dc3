"""Standing claim tickets (runtime.dispatch.tickets): which pools may hold one, what the waiter sends, and
the ticket's life against a real Valkey, the simulator and real dispatcher processes: a claim that
respects the caps, a lease record written on accept, a stopping dispatcher giving back what its inbox
holds, and a killed dispatcher whose claimed request REAP puts back for another to run."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import time

import orjson
import pytest

from runtime.backends.breaker import OPEN, BreakerState, encode_state
from runtime.config import DispatcherSettings
from runtime.dispatch.dispatcher import Dispatcher
from runtime.dispatch.tickets import Tickets, split_inbox_item, ticket_pools, ticket_text
from runtime.errors import QueueFull
from runtime.policy.admission import REASON_KEY_IN_FLIGHT, KeyLimits
from runtime.producer import Producer
from runtime.queue import groups
from runtime.queue.keys import TICKET_TTL_MS, KeySpace
from runtime.wire.backendconfig import BackendConfig
from runtime.wire.groupconfig import DURABLE, LISTS, GroupConfig, PoolConfig
from simulator.server import SimulatorConfig, SimulatorServer
from tests.support.dispatcher_process import start_dispatcher, start_dispatchers, stop_dispatcher
from tests.support.dispatching import CALL, NO_POLL, one_pool_group, running_dispatcher, slow_call, wait_until
from tests.support.durable import counted

KEYS = KeySpace("t:")


def two_pools(**changes: object) -> GroupConfig:
    base = GroupConfig(
        group_id="g", policy="fifo", total_concurrency=8, default_endpoint_url="http://sim",
        pools=(PoolConfig("a", max_concurrent=4), PoolConfig("b", max_concurrent=4)), version=1,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


def backed_pools() -> GroupConfig:
    """Pool a behind the backend row "row", pool b on the bare URL."""
    return two_pools(
        pools=(PoolConfig("a", max_concurrent=4, backend_id="row"), PoolConfig("b", max_concurrent=4)),
        backends=(BackendConfig("row", "http://sim"),),
    )


# --- which pools may hold a ticket --------------------------------------------------------------
def test_plain_pools_in_lists_mode_hold_tickets_on_bare_endpoints_and_behind_backend_rows() -> None:
    assert ticket_pools(two_pools()) == {"a", "b"}
    assert ticket_pools(backed_pools()) == {"a", "b"}


@pytest.mark.parametrize(
    ("why", "config", "expected"),
    [
        ("durable mode: a claim takes a fencing token", two_pools(delivery=DURABLE), set()),
        (
            "protected slots: a ticket's claim does not check what is owed to others",
            two_pools(pools=(PoolConfig("a", max_concurrent=4, min_concurrent=1), PoolConfig("b"))),
            set(),
        ),
        ("a fair pool", two_pools(pools=(PoolConfig("a", tenant_fairness="tokens"), PoolConfig("b"))), {"b"}),
        ("a paused pool", two_pools(pools=(PoolConfig("a", paused=True), PoolConfig("b"))), {"b"}),
        ("a disabled pool", two_pools(pools=(PoolConfig("a", enabled=False), PoolConfig("b"))), {"b"}),
    ],
)
def test_pools_whose_claims_need_a_round_hold_no_ticket(why: str, config: GroupConfig, expected: set) -> None:
    assert ticket_pools(config) == expected, why


# --- what the waiter sends ----------------------------------------------------------------------
def test_a_ticket_is_posted_moved_to_the_tail_withdrawn_once_and_holds_a_slot_while_it_stands() -> None:
    tickets = Tickets(KEYS, "d1", "g", lease_s=15.0).of(two_pools())
    assert tickets.holding() == 0
    posted = tickets.commands(offer=True, refused=["b"])
    ticket = f"{KEYS.inbox('d1', 'a')}\x004\x008\x0015.0"
    assert ticket == ticket_text((KEYS.inbox("d1", "a"), 4, 8, 15.0))
    assert posted == [
        ("LREM", KEYS.tickets("a"), 0, ticket),
        ("RPUSH", KEYS.tickets("a"), ticket),
        ("PEXPIRE", KEYS.tickets("a"), TICKET_TTL_MS),
    ]
    assert tickets.holding() == 1
    assert tickets.commands(offer=False) == [("LREM", KEYS.tickets("a"), 0, ticket)]
    assert tickets.commands(offer=False) == []  # withdrawn once
    assert tickets.holding() == 0


def test_a_backend_rows_ticket_carries_its_keys_and_limit_and_stands_only_with_a_limit() -> None:
    tickets = Tickets(KEYS, "d1", "g", lease_s=15.0).of(backed_pools())
    assert tickets.backed == {"a": "row"}
    assert [c[1] for c in tickets.commands(offer=True) if c[0] == "RPUSH"] == [KEYS.tickets("b")]
    posted = tickets.commands(offer=True, limits={"row": 6})
    fields = (KEYS.inbox("d1", "a"), 4, 8, 15.0)
    backend = (KEYS.backend_inflight("row"), KEYS.backend_hold("row"), KEYS.backend_breaker("row"))
    six = ticket_text((*fields, *backend, 6))
    assert ("RPUSH", KEYS.tickets("a"), six) in posted and tickets.holding() == 2
    # The gate's limit changed: the ticket posted with the old one is the one taken out.
    posted = tickets.commands(offer=True, limits={"row": 3})
    three = ticket_text((*fields, *backend, 3))
    assert posted[:3] == [
        ("LREM", KEYS.tickets("a"), 0, six),
        ("RPUSH", KEYS.tickets("a"), three),
        ("PEXPIRE", KEYS.tickets("a"), TICKET_TTL_MS),
    ]
    # No limit (the backend held, its breaker not closed, never read): withdrawn, b's stays.
    posted = tickets.commands(offer=True)
    assert ("LREM", KEYS.tickets("a"), 0, three) in posted and tickets.holding() == 1
    assert not [c for c in posted if c[0] == "RPUSH" and c[1] == KEYS.tickets("a")]


def test_an_accept_rides_before_the_next_blpop_and_is_sent_again_when_that_write_fails() -> None:
    tickets = Tickets(KEYS, "d1", "g", lease_s=15.0).of(two_pools())
    tickets.commands(offer=True)
    tickets.received("a")
    tickets.accepted("a\x1fr1", b"{}")
    accept = [
        ("HSET", KEYS.lease_records("g"), "a\x1fr1", b"{}"),
        ("HDEL", KEYS.durable_leases("g"), "a\x1fr1"),
    ]
    first = tickets.commands(offer=False)
    assert first[:2] == accept and tickets.holding() == 0
    tickets.unsent(first)
    again = tickets.commands(offer=False)
    assert again[:2] == accept  # not lost with the connection
    assert tickets.commands(offer=False) == []


def test_a_new_configuration_withdraws_the_tickets_of_pools_that_no_longer_qualify() -> None:
    tickets = Tickets(KEYS, "d1", "g", lease_s=15.0).of(two_pools())
    tickets.commands(offer=True)
    tickets.of(two_pools(pools=(PoolConfig("a", paused=True), PoolConfig("b")), version=2))
    assert set(tickets.offered) == {"b"}
    withdrawn = [c for c in tickets.commands(offer=False) if c[0] == "LREM"]
    assert {c[1] for c in withdrawn} == {KEYS.tickets("a"), KEYS.tickets("b")}
    # The paused pool's inbox is still watched: a request claimed just before still arrives.
    assert KEYS.inbox("d1", "a") in tickets.inboxes


def test_a_lease_not_longer_than_two_ticket_lifetimes_holds_no_ticket() -> None:
    """An inbox must lapse before its requests' leases expire, or REAP could requeue one still taken."""
    assert not Tickets(KEYS, "d1", "g", lease_s=2 * TICKET_TTL_MS / 1000).of(two_pools()).offered


def test_the_withdrawal_removes_the_tickets_before_it_empties_the_inboxes() -> None:
    tickets = Tickets(KEYS, "d1", "g", lease_s=15.0).of(two_pools())
    tickets.commands(offer=True)
    names = [c[0] for c in tickets.withdrawal()]
    assert names == ["LREM", "LREM", "LPOP", "LPOP"]
    assert split_inbox_item(b"a\x1fr1\0{}") == ("a\x1fr1", b"{}")


# --- against Valkey -------------------------------------------------------------------------------
async def ticket_standing(aredis, keys, pool_id: str = "default") -> bool:  # type: ignore[no-untyped-def]
    return bool(await aredis.llen(keys.tickets(pool_id)))


async def test_a_push_claims_against_the_ticket_only_within_the_pool_cap(aredis, keys) -> None:
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = one_pool_group(sim.url, total=16, max_concurrent=1)
        async with (
            running_dispatcher(aredis, keys, config, **NO_POLL) as dispatcher,
            Producer(aredis, keys=keys) as producer,
        ):
            await wait_until(lambda: ticket_standing(aredis, keys), what="the idle dispatcher's ticket")
            first = asyncio.create_task(producer.submit(slow_call(1500), pool_id="default", timeout=20))
            await wait_until(lambda: len(dispatcher.running) == 1, what="the first call running")
            assert dispatcher.stats.ticket_claims == 1
            await wait_until(lambda: ticket_standing(aredis, keys), what="the ticket posted again")
            second = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=20))
            # Left in its list: a claim would have popped it. (Its wake token's round then finds the
            # pool at its cap too.)
            await wait_until(lambda: aredis.llen(keys.requests("default")), what="the second queued")
            assert dispatcher.stats.ticket_claims == 1
            assert not first.done()
            [member] = list(dispatcher.running)
            record = orjson.loads(await aredis.hget(keys.lease_records("g"), member))
            assert record["dispatcher_id"] == dispatcher.identity.dispatcher_id  # written on accept
            assert not await aredis.hexists(keys.durable_leases("g"), member)  # its requeue entry gone
            await asyncio.gather(first, second)
        assert dispatcher.stats.completed == 2


KEY = KeyLimits("k1", "key one", max_in_flight=1, max_queued=1)


@pytest.mark.parametrize("admitted", ["a bounded pool", "an ingress key with limits"])
async def test_a_push_through_admission_control_claims_against_the_ticket_too(aredis, keys, admitted) -> None:
    """ADMIT_PUSH checks the limits, then claims as PUSH does: no round per call at concurrency 1, and
    the key's lease is taken with the claim, so the key's max_in_flight still counts the running call."""
    bounded = admitted == "a bounded pool"
    key = None if bounded else KEY
    async with SimulatorServer(SimulatorConfig()) as sim:
        config = one_pool_group(sim.url)
        if bounded:
            config = dataclasses.replace(
                config, pools=(PoolConfig("default", max_queued=4, max_queue_wait_s=30),)
            )
        async with (
            running_dispatcher(aredis, keys, config, **NO_POLL) as dispatcher,
            Producer(aredis, keys=keys) as producer,
        ):
            await wait_until(lambda: ticket_standing(aredis, keys), what="the idle dispatcher's ticket")
            rounds = dispatcher.stats.rounds
            for _ in range(5):
                await producer.submit(CALL, pool_id="default", timeout=10, key=key)
            assert dispatcher.stats.ticket_claims == 5, dispatcher.stats
            assert dispatcher.stats.rounds == rounds
            if bounded:
                return
            await wait_until(lambda: ticket_standing(aredis, keys), what="the ticket posted again")
            slow = asyncio.create_task(
                producer.submit(slow_call(1500), pool_id="default", timeout=20, key=key)
            )
            await wait_until(lambda: len(dispatcher.running) == 1, what="the slow call running")
            assert dispatcher.stats.ticket_claims == 6
            assert await aredis.zcard(keys.key_open("k1")) == 1  # the claim's call holds the key's lease
            with pytest.raises(QueueFull) as refused:
                await producer.submit(CALL, pool_id="default", timeout=10, key=key)
            assert refused.value.reason == REASON_KEY_IN_FLIGHT
            await slow
        assert await aredis.zcard(keys.key_open("k1")) == 0  # released with its reply


async def test_a_stopping_dispatcher_gives_back_what_its_inbox_holds(aredis, keys) -> None:
    """A push took the ticket of a dispatcher that then stops before taking the request from its inbox:
    the request goes back to the head of its list, its lease and requeue entry gone, the ticket too."""
    config = one_pool_group("http://127.0.0.1:9")
    await groups.publish(aredis, keys, config)
    dispatcher = Dispatcher(aredis, DispatcherSettings(group_id="g"), keys=keys)
    await dispatcher._wait_for_config()
    async with aredis.pipeline(transaction=False) as pipe:
        for command in dispatcher._ticket_commands(True):
            pipe.execute_command(*command)
        await pipe.execute()
    async with Producer(aredis, keys=keys) as producer:
        call = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=3))
        inbox = keys.inbox(dispatcher.identity.dispatcher_id, "default")
        await wait_until(lambda: aredis.llen(inbox), what="the request claimed into the inbox")
        assert await aredis.zcard(keys.group_inflight("g")) == 1
        await dispatcher._withdraw_tickets()
        assert dispatcher.stats.tickets_given_back == 1
        assert await aredis.llen(keys.requests("default")) == 1
        assert await aredis.llen(inbox) == 0 and not await ticket_standing(aredis, keys)
        assert await aredis.zcard(keys.group_inflight("g")) == 0
        assert await aredis.zcard(keys.pool_inflight("default")) == 0
        assert await aredis.hlen(keys.durable_leases("g")) == 0
        call.cancel()


async def _set_breaker(aredis, keys, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    await aredis.set(keys.backend_breaker("row"), raw)


async def _fill_backend(aredis, keys) -> None:  # type: ignore[no-untyped-def]
    # Another group's two calls in flight to the same backend (max_in_flight 2), leases far from expiry.
    await aredis.zadd(
        keys.backend_inflight("row"), {"other\x1fr1": time.time() + 60, "other\x1fr2": time.time() + 60}
    )


REFUSALS = {
    "a 429's hold, set by another dispatcher": lambda r, k: r.set(k.backend_hold("row"), b"1", px=60_000),
    "the backend's limit, reached by another group": _fill_backend,
    "its breaker, opened by another dispatcher": lambda r, k: _set_breaker(
        r, k, encode_state(BreakerState(mode=OPEN, since=time.time(), trips=1))
    ),
    "its breaker's state unreadable": lambda r, k: _set_breaker(r, k, b"{not json"),
}


async def backed_dispatcher(aredis, keys) -> Dispatcher:  # type: ignore[no-untyped-def]
    """A dispatcher (not running) of a group whose pool goes through the backend row "row" (max 2)."""
    backend = BackendConfig("row", "http://127.0.0.1:9", kind="openai", load_gating=False, max_in_flight=2)
    config = dataclasses.replace(
        one_pool_group(""), default_endpoint_url="", backend_id="row", backends=(backend,)
    )
    await groups.publish(aredis, keys, config)
    dispatcher = Dispatcher(aredis, DispatcherSettings(group_id="g"), keys=keys)
    await dispatcher._wait_for_config()
    return dispatcher


@pytest.mark.parametrize("refusal", [None, *REFUSALS])
async def test_a_backend_rows_ticket_claims_only_what_the_backend_may_take_now(aredis, keys, refusal) -> None:
    """The dispatcher's reading said room when it posted its ticket; what changed since in Valkey is
    what the push's claim checks: a hold, the fleet-wide limit, the shared breaker. Refused, the
    request stays queued (for a round, which checks the same), the ticket stands, no lease is taken."""
    dispatcher = await backed_dispatcher(aredis, keys)
    await dispatcher.fleet.refresh()
    commands = dispatcher._ticket_commands(True)
    assert [c[1] for c in commands if c[0] == "RPUSH"] == [keys.tickets("default")]
    async with aredis.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        await pipe.execute()
    if refusal is not None:
        await REFUSALS[refusal](aredis, keys)
    inbox = keys.inbox(dispatcher.identity.dispatcher_id, "default")
    async with Producer(aredis, keys=keys) as producer:
        call = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=3))
        try:
            await wait_until(
                lambda: aredis.llen(inbox) if refusal is None else aredis.llen(keys.requests("default")),
                what="the request claimed into the inbox, or queued",
            )
            leases = await aredis.zrange(keys.backend_inflight("row"), 0, -1)
            if refusal is None:
                [(member, _)] = [split_inbox_item(item) for item in await aredis.lrange(inbox, 0, -1)]
                assert leases == [member.encode()]  # the backend's lease taken with the pool's
                assert not await ticket_standing(aredis, keys)  # used up
            else:
                assert await aredis.llen(inbox) == 0
                assert await aredis.zcard(keys.group_inflight("g")) == 0, refusal
                assert not [m for m in leases if not m.startswith(b"other")], refusal
                assert await ticket_standing(aredis, keys), refusal  # still standing
                assert await aredis.llen(keys.wake_list("default")) == 1  # a round is woken instead
        finally:
            call.cancel()


@pytest.mark.parametrize("refusal", list(REFUSALS)[:3])
async def test_no_ticket_stands_for_a_backend_row_its_last_reading_refuses(aredis, keys, refusal) -> None:
    dispatcher = await backed_dispatcher(aredis, keys)
    assert not [c for c in dispatcher._ticket_commands(True) if c[0] == "RPUSH"]  # never read yet
    await dispatcher.fleet.refresh()
    assert [c[1] for c in dispatcher._ticket_commands(True) if c[0] == "RPUSH"] == [keys.tickets("default")]
    await REFUSALS[refusal](aredis, keys)
    await dispatcher.fleet.refresh()
    withdrawn = dispatcher._ticket_commands(True)
    assert [c[:2] for c in withdrawn if c[0] in ("LREM", "RPUSH")] == [("LREM", keys.tickets("default"))]


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_a_request_claimed_for_a_killed_dispatcher_is_requeued_and_run_by_another(
    aredis, sredis, keys, valkey_url
) -> None:
    """The dispatcher is frozen (SIGSTOP) with its ticket standing, a push claims for it, and it is
    killed before it accepted the request. Its lease expires, REAP puts it back at the head of its
    list, a second dispatcher runs it once, and nothing counts it lost."""
    lease_s = 5.0
    async with SimulatorServer(SimulatorConfig()) as sim:
        await groups.publish(aredis, keys, dataclasses.replace(one_pool_group(sim.url), delivery=LISTS))
        doomed = start_dispatcher(valkey_url, keys.prefix, "g", "doomed", concurrency=8, lease_s=lease_s)
        survivor = None
        try:
            async with Producer(aredis, keys=keys) as producer:
                await wait_until(lambda: ticket_standing(aredis, keys), what="the doomed dispatcher's ticket")
                doomed.send_signal(signal.SIGSTOP)
                call = asyncio.create_task(producer.submit(CALL, pool_id="default", timeout=30))
                # Claimed for the frozen dispatcher: Valkey hands the inbox item to its blocked BLPOP at
                # once (into a socket nobody reads), and the request is its lease's envelope to requeue.
                await wait_until(
                    lambda: aredis.hlen(keys.durable_leases("g")), timeout=5, what="the claim for the doomed"
                )
                assert await aredis.zcard(keys.group_inflight("g")) == 1
                assert await aredis.llen(keys.requests("default")) == 0
                doomed.send_signal(signal.SIGKILL)
                doomed.wait(5)
                [survivor] = await start_dispatchers(
                    valkey_url, keys.prefix, "g", ["survivor"], lease_s=lease_s
                )
                result = await call
            assert result.completion["choices"]
            assert sim.completions_total == 1
            await wait_until(
                lambda: counted(sredis, keys, "requeued") == 1, timeout=10, what="the requeue counted"
            )
            assert counted(sredis, keys, "dropped:lost_in_flight") == 0
        finally:
            for proc in (doomed, survivor):
                if proc is not None:
                    stop_dispatcher(proc)
