"""What a dispatcher is executing: one call (:class:`Running`) and the map of them it keeps."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.wire.contract import Envelope

__all__ = ["Running", "RunningCalls"]


@dataclass(slots=True)
class Running:
    """One request this dispatcher is executing."""

    envelope: Envelope
    pool_id: str
    member: str
    cost: int
    started_at: float
    stage: str = "executing"
    token: str = ""  # the claim's fencing token (durable mode); "" when unfenced
    backend_id: str = ""  # the backend row the call goes to ("" for a bare endpoint URL)


class RunningCalls(dict[str, Running]):
    """The calls a dispatcher is executing, by lease member, with a live count per pool: every round
    a wake token leads into needs the counts, and counting 2,000 calls in flight each time cost more
    than the round. Lookups stay the dict's own; only the three mutations it takes keep the count."""

    def __init__(self) -> None:
        super().__init__()
        self._by_pool: dict[str, int] = {}

    def __setitem__(self, member: str, run: Running) -> None:
        if member in self:
            self._forget(self[member])
        super().__setitem__(member, run)
        self._by_pool[run.pool_id] = self._by_pool.get(run.pool_id, 0) + 1

    def __delitem__(self, member: str) -> None:
        self._forget(self[member])
        super().__delitem__(member)

    def pop(self, member: str) -> Running:  # type: ignore[override]  # no default: a missing call is a bug
        run = super().pop(member)
        self._forget(run)
        return run

    def by_pool(self) -> dict[str, int]:
        """Calls in flight per pool (pools with none left out), a copy."""
        return dict(self._by_pool)

    def in_pool(self, pool_id: str) -> int:
        return self._by_pool.get(pool_id, 0)

    def _forget(self, run: Running) -> None:
        left = self._by_pool[run.pool_id] - 1
        if left:
            self._by_pool[run.pool_id] = left
        else:
            del self._by_pool[run.pool_id]

    def _unsupported(self, *args: object, **kwargs: object) -> None:
        raise TypeError("RunningCalls keeps a count per pool: use [] =, del or pop")

    clear = popitem = setdefault = update = __ior__ = _unsupported  # type: ignore[assignment]
