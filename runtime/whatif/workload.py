"""A trace made ready for replays: each request's base execution time and the fitted service model.

Built once per What-if (it fits the model under the configuration in force, whose routing produced
the history) and shared by the replays of the current and the proposed configuration.

A request that never ran when it was recorded (refused at admission, dropped) has no execution time:
it gets its pool's median, or the trace's when the pool has none, so a configuration that admits it
gives it a plausible call to run; nor a cost: it borrows its pool's recorded costs in turn. The
dispatcher's turnaround (a freed slot's idle time before its next launch) is measured on the trace too
(:func:`runtime.whatif.service.turnaround`).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable

from runtime.backends.redact import redact_url
from runtime.policy.scheduler import HeadItem
from runtime.whatif.service import ServiceFit, fit, in_flight_at_start, turnaround
from runtime.whatif.trace import Trace, percentile
from runtime.wire.groupconfig import GroupConfig

__all__ = ["Workload", "backend_name"]

DEFAULT_EXECUTION_S = 1.0  # only when the trace holds no executed call at all
UNLIMITED = 1 << 30


def backend_name(config: GroupConfig, pool_id: str) -> str:
    """The backend a pool's calls go to: its id, or the redacted URL of a bare endpoint."""
    route = config.route(pool_id)
    return route.backend_id or redact_url(route.endpoint)


def _costs(trace: Trace) -> list[int]:
    """Each request's cost; one whose cost history did not record (refused at submit: the producer
    does not cost requests) borrows the costs of its pool's recorded requests in turn, so the requests a
    proposed configuration admits cost what the pool's requests cost (1 when the pool recorded none)."""
    recorded: list[list[int]] = [[] for _ in trace.pools]
    for p, cost in zip(trace.pool, trace.cost, strict=True):
        if cost > 0:
            recorded[p].append(cost)
    borrowed = [0] * len(trace.pools)
    costs = []
    for p, cost in zip(trace.pool, trace.cost, strict=True):
        if cost <= 0:
            known = recorded[p]
            cost = known[borrowed[p] % len(known)] if known else 1
            borrowed[p] += 1
        costs.append(cost)
    return costs


class Workload:
    """The trace plus, per request, the execution time to replay and the in-flight it was recorded at."""

    def __init__(self, trace: Trace, current: GroupConfig) -> None:
        self.trace = trace
        n = len(trace)
        self.base_s = array("d", trace.execution_s)
        # What the scheduler is shown of each request at a pool's head; made once for both replays.
        self.heads = [HeadItem(c, t) for c, t in zip(_costs(trace), trace.enqueued_at, strict=True)]
        self.recorded_in_flight = array("i", [0]) * n
        names = [backend_name(current, pid) for pid in trace.pools]
        self.fits: dict[str, ServiceFit] = {}
        for name in sorted(set(names)):
            members = {ix for ix, other in enumerate(names) if other == name}
            self.fits[name] = self._fit(name, members)
        self._fit_of_pool = [self.fits[name] for name in names]
        self.turnaround = turnaround(self._calls(), current.total_concurrency)
        self._fill_unrun()

    def __repr__(self) -> str:
        return f"<Workload requests={len(self.trace)} backends={sorted(self.fits)}>"

    def _fit(self, name: str, pool_indices: set[int]) -> ServiceFit:
        """Fits one backend's line and records each of its calls' in-flight at start."""
        trace = self.trace
        calls = []
        for i in range(len(trace)):
            if trace.pool[i] in pool_indices and trace.ran(i):
                wait = trace.queue_wait_s[i]
                start = trace.enqueued_at[i] + (0.0 if math.isnan(wait) else wait)
                calls.append((start, start + trace.execution_s[i], i))
        calls.sort()
        counts = in_flight_at_start([c[0] for c in calls], [c[1] for c in calls])
        for (_, _, i), k in zip(calls, counts, strict=True):
            self.recorded_in_flight[i] = k
        result = fit(name, counts, [trace.execution_s[c[2]] for c in calls])
        typical = max(1, round(result.mean_in_flight))
        for i in range(len(trace)):
            if trace.pool[i] in pool_indices and not trace.ran(i):
                self.recorded_in_flight[i] = typical
        return result

    def _calls(self) -> list[tuple[float, float, float]]:
        """(enqueued, launched, ended) of every recorded call, by launch."""
        trace = self.trace
        calls = []
        for i in range(len(trace)):
            if trace.ran(i):
                wait = trace.queue_wait_s[i]
                launched = trace.enqueued_at[i] + (0.0 if math.isnan(wait) else wait)
                calls.append((trace.enqueued_at[i], launched, launched + trace.execution_s[i]))
        calls.sort(key=lambda c: c[1])
        return calls

    def _fill_unrun(self) -> None:
        trace = self.trace
        by_pool: list[list[float]] = [[] for _ in trace.pools]
        for i in range(len(trace)):
            if trace.ran(i):
                by_pool[trace.pool[i]].append(trace.execution_s[i])
        everything = sorted(v for values in by_pool for v in values)
        overall = percentile(everything, 0.5) or DEFAULT_EXECUTION_S
        medians = [percentile(sorted(values), 0.5) or overall for values in by_pool]
        for i in range(len(trace)):
            if not trace.ran(i):
                self.base_s[i] = medians[trace.pool[i]]

    def service_time(self, i: int, in_flight: int) -> float:
        """Seconds request ``i`` runs when it starts with ``in_flight`` calls on its backend (itself too)."""
        model = self._fit_of_pool[self.trace.pool[i]]
        base = self.base_s[i]
        if model.slope == 0.0:
            return base
        return base * model.scale(self.recorded_in_flight[i], in_flight)

    def backends_of(self, config: GroupConfig) -> tuple[list[str], list[int], dict[str, int]]:
        """Under ``config``: backend names, their caps (in index order) and each pool's backend index."""
        names: list[str] = []
        caps: list[int] = []
        of_pool: dict[str, int] = {}
        for pool in config.enabled_pools:
            name = backend_name(config, pool.pool_id)
            if name not in names:
                names.append(name)
                backend = config.backend_for(pool.pool_id)
                caps.append(backend.max_in_flight if backend is not None else UNLIMITED)
            of_pool[pool.pool_id] = names.index(name)
        return names, caps, of_pool

    def fit_lines(self) -> Iterable[str]:
        return (f.describe() for f in self.fits.values())
