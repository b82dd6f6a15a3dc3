"""Frozen, typed settings handed to the runtime.

The Django management commands (or a plain script) build these once from the environment; the
runtime never reads the environment or Django settings itself.
"""

from __future__ import annotations

import os
import socket
from dataclasses import field

from runtime.immutable import immutable
from runtime.policy.cost import CostModel
from runtime.queue import keys
from runtime.valkey.pipelined import DEFAULT_HEALTH_S
from runtime.wire.backendconfig import BreakerPolicy
from runtime.wire.contract import DEFAULT_MAX_ENVELOPE_BYTES


@immutable
class ProducerSettings:
    """How a producer submits work and stays visibly alive."""

    alive_ttl_s: float = keys.PRODUCER_ALIVE_TTL_S
    alive_refresh_s: float = keys.PRODUCER_ALIVE_REFRESH_S
    default_timeout_s: float = 120.0
    max_envelope_bytes: int = DEFAULT_MAX_ENVELOPE_BYTES
    # How long the known-pool list is trusted before it is read again from Valkey.
    pool_registry_refresh_s: float = 2.0
    # A Valkey that leaves a command unanswered this long (stopped, partitioned away) is lost: the
    # caller gets the usual connection error and the connection is rebuilt (runtime.valkey.client).
    valkey_health_s: float = DEFAULT_HEALTH_S
    # How long a durable push waits for Valkey's fsync (WAITAOF) and its replicas (WAIT) before it is
    # answered anyway, counted not_persisted (runtime.valkey.persisted).
    persist_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        if self.alive_ttl_s <= 0 or self.alive_refresh_s <= 0:
            raise ValueError("producer liveness TTL and refresh interval must be positive")
        if self.alive_refresh_s * 2 > self.alive_ttl_s:
            raise ValueError(
                f"liveness refresh ({self.alive_refresh_s}s) must be at most half "
                f"the TTL ({self.alive_ttl_s}s)"
            )
        if self.max_envelope_bytes < 1024:
            raise ValueError("max_envelope_bytes must be at least 1024")
        _check_health(self.valkey_health_s)


@immutable
class DispatcherSettings:
    """One dispatcher process of a fabric group."""

    group_id: str
    dispatcher_id: str = field(default_factory=lambda: default_dispatcher_id())
    gateway_id: str = field(default_factory=socket.gethostname)
    # Calls this process runs at once; the group total in the published config caps all processes.
    concurrency: int = 64
    shutdown_grace_s: float = 30.0
    lease_s: float = keys.INFLIGHT_LEASE_S
    reply_ttl_s: float = keys.REPLY_LIST_TTL_S
    # Idle poll, shared by the fleet (one poll per interval per group): for producers that push without
    # a wake-up token, deadlines, expired leases and breakers.
    idle_poll_s: float = 0.05
    # Standing claim tickets (runtime.dispatch.tickets): at low concurrency a push claims its request for
    # an idle dispatcher, saving the claim's round trip. Off: every call is claimed by a round.
    claim_tickets: bool = True
    # How many items of each pool's head are read per scheduling round.
    peek_depth: int = 8
    reconnect_backoff_s: tuple[float, float] = (0.1, 5.0)
    # How long a finished call's FINISH (its reply and lease release) is retried while Valkey fails: a
    # Sentinel failover takes a few seconds, and the call's result is lost only past this.
    finish_retry_s: float = 15.0
    backend_timeout_s: float = 120.0
    backend_connect_timeout_s: float = 5.0
    snapshot_interval_s: float = 0.25
    snapshot_ttl_s: float = keys.SNAPSHOT_TTL_S
    cost: CostModel = field(default_factory=CostModel)
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    # A Valkey that leaves a command unanswered this long is lost (see ProducerSettings): the round
    # fails with the usual connection error, and the dashboard is told Valkey is unreachable.
    valkey_health_s: float = DEFAULT_HEALTH_S

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("a dispatcher needs a fabric group id")
        if self.concurrency < 1:
            raise ValueError("dispatcher concurrency must be at least 1")
        if self.lease_s <= 1:
            raise ValueError("the in-flight lease must be longer than one second")
        if self.peek_depth < 1:
            raise ValueError("peek_depth must be at least 1")
        _check_health(self.valkey_health_s)


def _check_health(health_s: float) -> None:
    if not health_s > 0:
        raise ValueError(f"the Valkey health check must be more than 0 seconds (got {health_s!r})")


def default_dispatcher_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
