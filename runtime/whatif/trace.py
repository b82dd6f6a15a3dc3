"""Recorded traffic for a what-if replay: one row per request, kept as flat arrays.

A trace holds, for each request of the window, what the replay needs and nothing else: when it was
enqueued, its pool, its tenant (when the request had one), its cost units and tokens, and what history
recorded of its run (queue wait, execution time; NaN when it never ran, e.g. refused at admission).
Columns are ``array`` objects (8 bytes a float, 4 an int), so an hour of demo traffic (~40,000
requests) takes about 2 MB and a full day stays bounded by :data:`MAX_REQUESTS`.

Rows are kept sorted by enqueue time (ties in insertion order): the replay walks them in that order.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from runtime.immutable import immutable

__all__ = ["MAX_REQUESTS", "Arrival", "Trace", "TraceTooLarge"]

# Half a day of the demo's traffic (~20 MB of arrays; a replay of it takes about 15 s of CPU). More is
# refused with TraceTooLarge, so that one request of the admin page cannot take the web process's memory.
MAX_REQUESTS = 500_000
NAN = math.nan


class TraceTooLarge(ValueError):
    """The window holds more requests than a replay takes; ask for a shorter window."""


@immutable
class Arrival:
    """One recorded request, as read from history (the input rows of :meth:`Trace.build`)."""

    enqueued_at: float
    pool_id: str
    cost: int = 1  # 0: not recorded (a refusal at submit, before the dispatcher costed it)
    execution_s: float | None = None  # None: it never ran (refused, dropped)
    queue_wait_s: float | None = None
    tenant: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    refused: bool = False  # refused at admission when it was recorded


@dataclass(slots=True)
class Trace:
    """Column arrays of a window's requests, sorted by enqueue time; pool and tenant are indices."""

    pools: list[str] = field(default_factory=list)  # pool index -> pool id
    tenants: list[str] = field(default_factory=list)  # tenant index -> tenant ('' = none)
    enqueued_at: array[float] = field(default_factory=lambda: array("d"))
    pool: array[int] = field(default_factory=lambda: array("i"))
    tenant: array[int] = field(default_factory=lambda: array("i"))
    cost: array[int] = field(default_factory=lambda: array("i"))  # 0: not recorded
    execution_s: array[float] = field(default_factory=lambda: array("d"))  # NaN: never ran
    queue_wait_s: array[float] = field(default_factory=lambda: array("d"))  # NaN: never ran
    input_tokens: array[int] = field(default_factory=lambda: array("i"))  # 0: none reported
    output_tokens: array[int] = field(default_factory=lambda: array("i"))
    refused: array[int] = field(default_factory=lambda: array("b"))
    start: float = 0.0  # the window replayed: [start, end)
    end: float = 0.0
    _pool_ix: dict[str, int] = field(default_factory=dict, repr=False)
    _tenant_ix: dict[str, int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.enqueued_at)

    def __repr__(self) -> str:
        return f"<Trace requests={len(self)} pools={self.pools} window={self.end - self.start:.0f}s>"

    @classmethod
    def build(
        cls, arrivals: Iterable[Arrival], *, start: float | None = None, end: float | None = None
    ) -> Trace:
        """A trace of ``arrivals`` (any order); see :meth:`close` for the window."""
        trace = cls()
        for a in sorted(arrivals, key=lambda a: a.enqueued_at):
            trace.append(a)
        return trace.close(start=start, end=end)

    def append(self, a: Arrival) -> None:
        """Adds the next request; requests come in enqueue order (a reader streams them in)."""
        self.extend(
            enqueued_at=(a.enqueued_at,),
            pool_ids=(a.pool_id,),
            tenants=(a.tenant,),
            cost=(a.cost,),
            execution_s=(a.execution_s,),
            queue_wait_s=(a.queue_wait_s,),
            input_tokens=(a.input_tokens,),
            output_tokens=(a.output_tokens,),
            refused=(a.refused,),
        )

    def extend(
        self,
        *,
        enqueued_at: Sequence[float],
        pool_ids: Sequence[str],
        tenants: Sequence[str],
        cost: Sequence[int],
        execution_s: Sequence[float | None],
        queue_wait_s: Sequence[float | None],
        input_tokens: Sequence[int],
        output_tokens: Sequence[int],
        refused: Sequence[bool],
    ) -> None:
        """Adds the next requests, given as columns (what a column-oriented read returns; the fields of
        :class:`Arrival`, ``None`` for a time not recorded), in enqueue order."""
        n = len(enqueued_at)
        if not n:
            return
        last = self.enqueued_at[-1] if self.enqueued_at else -math.inf
        if enqueued_at[0] < last or any(b < a for a, b in itertools.pairwise(enqueued_at)):
            raise ValueError("arrivals must be appended in enqueue order")
        if len(self.enqueued_at) + n > MAX_REQUESTS:
            raise TraceTooLarge(f"the window holds more requests than a replay takes ({MAX_REQUESTS})")
        self.enqueued_at.extend(enqueued_at)
        self.pool.extend(_interned(pool_ids, self._pool_ix, self.pools))
        self.tenant.extend(_interned(tenants, self._tenant_ix, self.tenants))
        self.cost.extend([c if c > 0 else 0 for c in map(int, cost)])
        self.execution_s.extend([NAN if v is None else max(0.0, v) for v in execution_s])
        self.queue_wait_s.extend([NAN if v is None else max(0.0, v) for v in queue_wait_s])
        self.input_tokens.extend([t if t > 0 else 0 for t in input_tokens])
        self.output_tokens.extend([t if t > 0 else 0 for t in output_tokens])
        self.refused.extend([1 if r else 0 for r in refused])

    def close(self, *, start: float | None = None, end: float | None = None) -> Trace:
        """Sets the window: by default from the first to the last arrival; it always holds every
        arrival. A replay stops at its end. Returns the trace."""
        first = self.enqueued_at[0] if self.enqueued_at else 0.0
        last = self.enqueued_at[-1] if self.enqueued_at else 0.0
        self.start = first if start is None else start
        self.end = max(last, self.start) if end is None else max(end, last, self.start)
        return self

    def ran(self, i: int) -> bool:
        """Whether request ``i`` was executed when it was recorded."""
        return not math.isnan(self.execution_s[i])


def _interned(values: Iterable[str], index: dict[str, int], names: list[str]) -> list[int]:
    """Each value's index in ``names``, new values appended (pools and tenants are few, rows many)."""
    out = []
    for value in values:
        found = index.get(value)
        if found is None:
            found = index[value] = len(names)
            names.append(value)
        out.append(found)
    return out


def percentile(sorted_values: Sequence[float], level: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default, ClickHouse's exact quantiles)."""
    n = len(sorted_values)
    if n == 0:
        return None
    h = (n - 1) * level
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])
