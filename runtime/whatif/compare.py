"""A What-if: the same recorded window replayed under the configuration in force and a proposed one.

:func:`what_if` is the one entry point of the admin page and of ``manage.py whatif``: it builds the
workload once (fitting the service model), replays twice and returns both results with what history
recorded for the window, so a reader sees how far the replay of the current configuration is from
reality before trusting the proposed one. :func:`format_table` is the command's text rendering.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from runtime.immutable import immutable
from runtime.whatif.engine import LEVELS, PoolOutcome, Replay, replay
from runtime.whatif.service import ServiceFit, Turnaround
from runtime.whatif.trace import Trace, percentile
from runtime.whatif.workload import Workload
from runtime.wire.groupconfig import GroupConfig

__all__ = ["Recorded", "WhatIf", "format_table", "what_if"]


@immutable
class Recorded:
    """What history recorded for one pool over the window."""

    pool_id: str
    arrivals: int
    refused: int
    wait: dict[float, float | None]


@immutable
class WhatIf:
    trace: Trace
    current: Replay
    proposed: Replay
    recorded: dict[str, Recorded]
    fits: tuple[ServiceFit, ...]
    turnaround: Turnaround

    def model_lines(self) -> list[str]:
        """The service model as fitted on the window: one line per backend, then the turnaround."""
        return [*(f.describe() for f in self.fits), self.turnaround.describe()]

    @property
    def pool_ids(self) -> list[str]:
        """Pools of either configuration, then pools only the trace knows, in first-seen order."""
        ids: list[str] = []
        for outcome in (*self.current.pools, *self.proposed.pools):
            if outcome.pool_id not in ids:
                ids.append(outcome.pool_id)
        return ids

    def rows(self) -> list[tuple[str, PoolOutcome | None, PoolOutcome | None, Recorded | None]]:
        """(pool, current, proposed, recorded) per pool."""
        current = {p.pool_id: p for p in self.current.pools}
        proposed = {p.pool_id: p for p in self.proposed.pools}
        return [(pid, current.get(pid), proposed.get(pid), self.recorded.get(pid)) for pid in self.pool_ids]


def what_if(
    trace: Trace,
    current: GroupConfig,
    proposed: GroupConfig,
    *,
    tenant_weights: Mapping[str, float] | None = None,
) -> WhatIf:
    """Replays ``trace`` under both configurations (see the module docstring); ``tenant_weights``
    gives the fair pools' tenants their weights (absent: 1)."""
    workload = Workload(trace, current)
    now = replay(workload, current, tenant_weights=tenant_weights)
    return WhatIf(
        trace=trace,
        current=now,
        # The panel opened before any edit asks for the same configuration twice: one replay is enough.
        proposed=now if proposed == current else replay(workload, proposed, tenant_weights=tenant_weights),
        recorded=recorded(trace),
        fits=tuple(workload.fits.values()),
        turnaround=workload.turnaround,
    )


def recorded(trace: Trace) -> dict[str, Recorded]:
    waits: list[list[float]] = [[] for _ in trace.pools]
    arrivals = [0] * len(trace.pools)
    refused = [0] * len(trace.pools)
    for i in range(len(trace)):
        p = trace.pool[i]
        arrivals[p] += 1
        refused[p] += trace.refused[i]
        wait = trace.queue_wait_s[i]
        if not math.isnan(wait) and trace.ran(i):
            waits[p].append(wait)
    result = {}
    for p, pid in enumerate(trace.pools):
        values = sorted(waits[p])
        result[pid] = Recorded(pid, arrivals[p], refused[p], {lv: percentile(values, lv) for lv in LEVELS})
    return result


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def format_table(result: WhatIf) -> str:
    """Plain-text table: per pool, recorded, current replay and proposed replay side by side."""
    header = (
        f"{'pool':<18} {'side':<9} {'p50':>8} {'p95':>8} {'p99':>8} {'req/s':>7} "
        f"{'peak q':>7} {'refused':>8} {'queued@end':>10}"
    )
    lines = [
        f"What-if over {result.trace.end - result.trace.start:.0f}s of recorded traffic "
        f"({len(result.trace)} requests)",
        header,
        "-" * len(header),
    ]
    for pid, cur, prop, rec in result.rows():
        if rec is not None:
            w = rec.wait
            lines.append(
                f"{pid:<18} {'recorded':<9} {_s(w[0.5]):>8} {_s(w[0.95]):>8} {_s(w[0.99]):>8} "
                f"{'':>7} {'':>7} {rec.refused:>8} {'':>10}"
            )
        for side, outcome in (("current", cur), ("proposed", prop)):
            if outcome is None:
                lines.append(f"{pid:<18} {side:<9} {'(not in this configuration)':>30}")
                continue
            w = outcome.wait
            lines.append(
                f"{pid:<18} {side:<9} {_s(w[0.5]):>8} {_s(w[0.95]):>8} {_s(w[0.99]):>8} "
                f"{outcome.throughput_per_s:>7.2f} {outcome.peak_depth:>7} {outcome.refused:>8} "
                f"{outcome.unserved:>10}"
            )
    lines.append("")
    lines.append("Service model (execution time against calls in flight on the backend; dispatcher):")
    lines.extend(f"  {line}" for line in result.model_lines())
    return "\n".join(lines)
