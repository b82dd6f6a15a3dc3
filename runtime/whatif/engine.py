"""The replay: recorded arrivals through the real scheduler, on a virtual clock.

A discrete-event simulation of one dispatcher holding the whole group (a fleet behaves as one: it
shares the group's slots and takes turns deciding). Events are arrivals (from the trace) and
completions (a launched call's modelled execution time later). After the events of an instant, the
simulated dispatcher runs scheduling rounds as the real one does -- observe every pool, ask
:func:`runtime.policy.scheduler.decide`, claim what it names -- until a round launches nothing:

* a round is skipped when the group is full (the dispatcher does not decide then either);
* heads are read only of pools that could launch: not paused, under their cap, and whose backend
  has room; at most ``peek_depth`` (or the pool's burst) heads, and no more than the backend's room;
* a launch over the backend's ``max_in_flight`` is refused by the claim, and its credit refunded;
* an arrival passes the pool's admission limits first (:func:`runtime.policy.admission.decide`, with
  the drain rate measured over the last whole seconds, as the producer's script does), and a fair
  pool's ``max_queued_per_tenant``;
* a fair pool (``tenant_fairness`` on) shows the heads its tenants' counters plan and launches from the
  lowest counter's tenant (:class:`runtime.whatif.queues.FairQueue`, the dispatcher's pure code);
* the dispatcher reacts to events its measured turnaround later (:class:`runtime.whatif.service.
  Turnaround`: the FINISH or the push, the wake, the round's reads): a round runs one recorded gap
  (taken in turn) after the first event that asked for one, and sees every event until then (a freed
  slot stays idle that long, an arrival into a group with room waits that long, events close together
  share one round);
* after a decision that launched nothing, no new one is asked for until something it saw changes (a
  completion, or an arrival at a pool that could launch or was idle): the same observations would
  launch nothing again (only pools whose heads were read are visited), and the DRR round it would
  advance is compared for equality only, so skipping it changes no later decision.

The replay stops at the window's end, as history does: waits are those of requests launched by then,
and what is still queued is counted apart (``unserved``). Predicting a starving pool's waits from the
requests that were served is what history would show too; the queued count says how many were not.

Not modelled: backend load gating on scraped metrics, breakers, retries, deadlines, producers that
go away. Pure: no clock, no I/O; memory is a few arrays of the trace's length.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Mapping

from runtime.backends.gate import SKIP_BACKEND_CAP
from runtime.policy import admission
from runtime.policy.admission import AdmissionLimits
from runtime.policy.scheduler import (
    GroupPolicy,
    HeadItem,
    Launch,
    PoolObservation,
    PoolPolicy,
    SchedulerState,
    decide,
    refund,
)
from runtime.whatif.outcome import DEPTH_BUCKETS, LEVELS, PoolOutcome, PoolTally, Replay, summarize
from runtime.whatif.queues import FairQueue, FifoQueue
from runtime.whatif.trace import Trace
from runtime.whatif.workload import Workload
from runtime.wire.groupconfig import GroupConfig

__all__ = ["DEPTH_BUCKETS", "LEVELS", "PoolOutcome", "Replay", "replay"]

Queue = FifoQueue | FairQueue
PEEK_DEPTH = 8  # the dispatcher's default peek depth (runtime.config)
NOT_LAUNCHED = math.nan


class _Pool:
    """One pool's queue and counters during a replay."""

    __slots__ = (
        "backend",
        "depth",
        "done",
        "drain",
        "fair",
        "heads",
        "idle",
        "in_flight",
        "limits",
        "peak",
        "peak_in_flight",
        "policy",
        "queue",
        "rate",
        "rate_second",
        "readable",
        "refused",
        "stale",
    )

    def __init__(self, policy: PoolPolicy, backend: int, limits: AdmissionLimits, queue: Queue) -> None:
        self.policy = policy
        self.backend = backend
        self.limits = limits
        self.queue = queue
        self.fair = isinstance(queue, FairQueue)  # its heads change with any arrival or correction
        self.heads: tuple[HeadItem, ...] | None = None  # cached first heads; None: stale
        self.stale = True  # its observation must be made again before the next decision
        self.readable = False  # the last observation decided on showed heads (the pool could launch)
        self.in_flight = 0
        self.idle: dict[int, PoolObservation] = {}  # in-flight count -> its observation with no backlog
        self.peak = 0
        self.refused = 0
        self.depth = [0] * DEPTH_BUCKETS
        self.drain: dict[int, int] = {}  # whole second -> requests that left the queue in it
        self.rate_second, self.rate = -1, 0.0  # the drain rate as of the start of that second
        self.done = 0  # calls completed inside the window
        self.peak_in_flight = 0

    def drain_rate(self, now: float) -> float:
        """Departures per second over the last whole seconds before ``now`` (the script's rule).

        Kept for the second: the replay's clock only goes forward, and departures in the current
        second count from the next one on."""
        sec = int(now)
        if sec != self.rate_second:
            window = admission.DRAIN_WINDOW_S
            self.rate = sum(self.drain.get(s, 0) for s in range(sec - window, sec)) / window
            self.rate_second = sec
        return self.rate

    def left(self, now: float) -> None:
        sec = int(now)
        self.drain[sec] = self.drain.get(sec, 0) + 1
        if len(self.drain) > admission.DRAIN_WINDOW_S + 2:
            for old in [s for s in self.drain if s < sec - admission.DRAIN_WINDOW_S]:
                del self.drain[old]


def replay(
    workload: Workload,
    config: GroupConfig,
    *,
    peek_depth: int = PEEK_DEPTH,
    tenant_weights: Mapping[str, float] | None = None,
) -> Replay:
    """Replays the workload's trace under ``config``; see the module docstring. ``tenant_weights``:
    the weight of each tenant of the fair pools (absent: 1)."""
    return _Sim(workload, config, peek_depth, tenant_weights or {}).run()


class _Sim:
    def __init__(
        self, workload: Workload, config: GroupConfig, peek_depth: int, weights: Mapping[str, float]
    ) -> None:
        self.workload = workload
        self.trace: Trace = workload.trace
        self.heads_of = workload.heads
        self.policy: GroupPolicy = config.scheduler_policy()
        self.state = SchedulerState()
        self.backend_names, self.backend_caps, backend_of = workload.backends_of(config)
        self.backend_in_flight = [0] * len(self.backend_names)
        self.backend_peak = [0] * len(self.backend_names)
        self.depth = max(peek_depth, *(p.max_burst_per_visit for p in self.policy.pools), 1)
        self.pools: dict[str, _Pool] = {}
        by_id = {p.pool_id: p for p in config.enabled_pools}
        for pp in self.policy.pools:
            pc = by_id[pp.pool_id]
            queue = FairQueue(self.trace, pc, weights) if pc.tenant_cost() else FifoQueue()
            self.pools[pp.pool_id] = _Pool(pp, backend_of[pp.pool_id], pc.admission_limits(), queue)
        # Trace pool index -> its _Pool (None: the pool is not in this configuration: refused).
        self.by_index: list[_Pool | None] = [self.pools.get(pid) for pid in self.trace.pools]
        # Arrivals of pools this configuration does not have (removed, disabled): refused at submit.
        self.unknown = {pid: 0 for pid, ok in zip(self.trace.pools, self.by_index, strict=True) if not ok}
        self.pool_items = list(self.pools.items())
        self.backend_pools: list[list[_Pool]] = [[] for _ in self.backend_names]
        for pool in self.pools.values():
            self.backend_pools[pool.backend].append(pool)
        self.observations: dict[str, PoolObservation] = {}  # what the next decision is shown
        self.queued = 0  # admitted requests not launched yet, all pools
        self.group_in_flight = 0
        self.peak_in_flight = 0
        # The last decision launched nothing, and nothing it saw has changed since: deciding again on
        # the same observations would launch nothing either (only pools that can launch are visited).
        self.stalled = False
        self.launched_at = array("d", [NOT_LAUNCHED]) * len(self.trace)
        self.ended_at = array("d", [NOT_LAUNCHED]) * len(self.trace)
        self.order: array[int] = array("i")
        self.completions: list[tuple[float, int]] = []  # (end, request)
        self.started: list[tuple[int, int]] = []  # (request, backend) launched at this instant
        self.decisions = 0
        span = self.trace.end - self.trace.start
        # A window of a few denormal seconds (hypothesis found one) makes a zero-width slice.
        self.bucket_s = span / DEPTH_BUCKETS if span / DEPTH_BUCKETS > 0 else 1.0
        self.bucket = -1
        self.next_bucket_at = self.trace.start  # the first event at or after this opens a new slice

    def run(self) -> Replay:
        trace, n = self.trace, len(self.trace)
        times = trace.enqueued_at
        completions = self.completions
        pop, finish, arrive = heapq.heappop, self._finish, self._arrive
        total = self.policy.total_concurrency
        gaps = self.workload.turnaround.gaps or (0.0,)
        taken = 0  # rounds asked for so far: each waits the next recorded gap
        i = 0
        window_end = trace.end
        round_at = math.inf  # when the round the last events asked for runs (inf: none asked for)
        while i < n or completions or round_at < math.inf:
            now = times[i] if i < n else math.inf
            if completions and completions[0][0] <= now:
                now = completions[0][0]
            if round_at < now:
                now, round_at = round_at, math.inf
                events = False  # the dispatcher's round, after the events it reacts to
            else:
                events = True
            if now > window_end:
                break  # history of the window holds what ran by its end; the rest is still queued
            if now >= self.next_bucket_at:
                self._advance_buckets(now)
            if events:
                while completions and completions[0][0] <= now:
                    end, request = pop(completions)
                    finish(request, end)
                while i < n and times[i] <= now:
                    arrive(i, now)
                    i += 1
                if round_at < math.inf or not self.queued or self.group_in_flight >= total or self.stalled:
                    continue
                latency = gaps[taken % len(gaps)]
                taken += 1
                if latency > 0:
                    round_at = now + latency
                    continue
            self._rounds(now)
            if self.started:
                self._run_started(now)
        return self._result()

    def _run_started(self, now: float) -> None:
        """Calls launched at this instant run as long as the load of the instant makes them (every
        call that started with them counts, as in :func:`runtime.whatif.service.in_flight_at_start`)."""
        service_time, in_flight, ended_at = self.workload.service_time, self.backend_in_flight, self.ended_at
        push, completions = heapq.heappush, self.completions
        for i, backend in self.started:
            end = ended_at[i] = now + service_time(i, in_flight[backend])
            push(completions, (end, i))
        self.started.clear()

    def _advance_buckets(self, now: float) -> None:
        bucket = min(DEPTH_BUCKETS - 1, int((now - self.trace.start) / self.bucket_s))
        for pool in self.pools.values():
            current = len(pool.queue)
            for b in range(max(0, self.bucket + 1), bucket + 1):
                pool.depth[b] = current
        self.bucket = bucket
        self.next_bucket_at = self.trace.start + (bucket + 1) * self.bucket_s

    def _arrive(self, i: int, now: float) -> None:
        pool = self.by_index[self.trace.pool[i]]
        if pool is None:
            self.unknown[self.trace.pools[self.trace.pool[i]]] += 1
            return
        queue = pool.queue
        depth = len(queue)
        if pool.limits.bounded and admission.decide(depth, pool.limits, pool.drain_rate(now)) is not None:
            pool.refused += 1
            return
        if pool.fair and queue.refuses(i):  # per-tenant admission: a first-come pool has none
            pool.refused += 1
            return
        queue.append(i)
        self.queued += 1
        pool.stale = True
        if depth == 0 or pool.readable:
            self.stalled = False  # a pool that may launch saw its queue change
        depth += 1
        if depth <= self.depth or pool.fair:
            pool.heads = None
        if depth > pool.peak:
            pool.peak = depth
        if self.bucket >= 0 and depth > pool.depth[self.bucket]:
            pool.depth[self.bucket] = depth

    def _finish(self, i: int, end: float) -> None:
        pool = self.by_index[self.trace.pool[i]]
        assert pool is not None
        if end <= self.trace.end:
            pool.done += 1
        pool.in_flight -= 1
        self.backend_in_flight[pool.backend] -= 1
        if pool.fair:
            pool.queue.finished(i)
            pool.heads = None
        self._changed(pool, True)
        self.group_in_flight -= 1
        self.stalled = False

    def _observe(self) -> dict[str, PoolObservation]:
        observations = self.observations
        for pid, pool in self.pool_items:
            if pool.stale:
                pool.stale = False
                if len(pool.queue):
                    observations[pid] = seen = self._observation(pid, pool)
                    pool.readable = bool(seen.heads)
                else:  # idle: the same few observations again and again, one per in-flight count
                    idle = pool.idle.get(pool.in_flight)
                    if idle is None:
                        idle = pool.idle[pool.in_flight] = PoolObservation(pid, 0, (), pool.in_flight)
                    observations[pid] = idle
                    pool.readable = False
        return observations

    def _observation(self, pid: str, pool: _Pool) -> PoolObservation:
        """What the dispatcher reads of a pool with backlog."""
        backlog = len(pool.queue)
        room = self.backend_caps[pool.backend] - self.backend_in_flight[pool.backend]
        blocked = SKIP_BACKEND_CAP if room <= 0 else None
        policy = pool.policy
        if blocked or policy.paused or pool.in_flight >= policy.max_concurrent:
            heads: tuple[HeadItem, ...] = ()  # not read: the pool cannot launch
        else:
            heads = pool.heads if pool.heads is not None else self._peek(pool)
            if room < len(heads):
                heads = heads[:room]
        return PoolObservation(pid, backlog, heads, pool.in_flight, blocked)

    def _changed(self, pool: _Pool, backend_room_changed: bool) -> None:
        """Mark stale the observations a change made so: the pool's, and those of its backend's
        pools when the backend's room is now small enough to block or trim their heads."""
        pool.stale = True
        if backend_room_changed:
            room = self.backend_caps[pool.backend] - self.backend_in_flight[pool.backend]
            if room <= self.depth:
                for other in self.backend_pools[pool.backend]:
                    other.stale = True

    def _peek(self, pool: _Pool) -> tuple[HeadItem, ...]:
        heads = pool.heads = tuple(map(self.heads_of.__getitem__, pool.queue.first(self.depth)))
        return heads

    def _rounds(self, now: float) -> None:
        policy, state, pools, claim = self.policy, self.state, self.pools, self._claim
        total = policy.total_concurrency
        while self.group_in_flight < total and self.queued:
            observations = self._observe()
            self.decisions += 1
            decision = decide(
                policy,
                state,
                observations,
                group_in_flight=self.group_in_flight,
                local_free_slots=total - self.group_in_flight,
            )
            if not decision.launches:
                self.stalled = True
                return
            for launch in decision.launches:
                claim(pools[launch.pool_id], launch, now)

    def _claim(self, pool: _Pool, launch: Launch, now: float) -> None:
        backend = pool.backend
        in_flight = self.backend_in_flight[backend] + 1
        if in_flight > self.backend_caps[backend]:
            refund(self.state, launch)
            return
        i = pool.queue.popleft()
        self.queued -= 1
        pool.heads = None
        if pool.limits.bounded:
            pool.left(now)
        pool.in_flight += 1
        if pool.in_flight > pool.peak_in_flight:
            pool.peak_in_flight = pool.in_flight
        self.backend_in_flight[backend] = in_flight
        self._changed(pool, True)
        self.group_in_flight += 1
        if in_flight > self.backend_peak[backend]:
            self.backend_peak[backend] = in_flight
        if self.group_in_flight > self.peak_in_flight:
            self.peak_in_flight = self.group_in_flight
        self.launched_at[i] = now
        self.order.append(i)
        self.started.append((i, backend))

    def _result(self) -> Replay:
        return summarize(
            self.trace,
            {
                pid: PoolTally(p.refused, len(p.queue), p.done, p.peak, p.depth, p.peak_in_flight)
                for pid, p in self.pools.items()
            },
            self.unknown,
            launch_order=self.order,
            launched_at=self.launched_at,
            ended_at=self.ended_at,
            peak_in_flight=self.peak_in_flight,
            peak_backend_in_flight=dict(zip(self.backend_names, self.backend_peak, strict=True)),
            decisions=self.decisions,
        )
