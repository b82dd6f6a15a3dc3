"""The dashboard websocket: streams the merged live view of one fabric group to a staff browser.

On connect the consumer paints from the snapshots kept in Valkey, then joins the group's channel-layer
group (see :mod:`dashboard.publisher`) and re-merges on every ``fabric.snapshot`` event with the
per-dispatcher snapshots it keeps in memory. Sends are coalesced (at most one per
:data:`MIN_SEND_INTERVAL_S`); every :data:`REFRESH_S` it re-reads Valkey, which notices dispatchers that
stopped or started without an event reaching us, and lets expired snapshots age out of the view.

Close codes: 4401 not logged in, 4403 not staff, 4404 unknown fabric group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboard import merge, publisher, selectors
from runtime.dispatch.snapshot import DispatcherSnapshot

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_UNKNOWN_GROUP = 4404
MIN_SEND_INTERVAL_S = 0.2
REFRESH_S = 2.0


class FabricConsumer(AsyncJsonWebsocketConsumer):
    """``ws/fabric/<group_id>/``: one browser watching one fabric group."""

    group_id = ""
    layer_group = ""

    def __repr__(self) -> str:
        return (
            f"<FabricConsumer group={self.group_id} dispatchers={len(getattr(self, 'snapshots', {}))} "
            f"sent={getattr(self, 'sent', 0)}>"
        )

    async def connect(self) -> None:
        user = self.scope.get("user")
        self.snapshots: dict[str, DispatcherSnapshot] = {}
        self.sent = 0
        self._task: asyncio.Task[None] | None = None
        # Accept, then close with a code: a refused handshake would reach the browser only as 1006.
        if user is None or not user.is_authenticated:
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not user.is_staff:
            await self.accept()
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group_id = self.scope["url_route"]["kwargs"]["group_id"]
        self.configured: list[merge.ConfiguredPool] = []
        try:
            self.configured = await database_sync_to_async(selectors.configured_pools)(group_id=self.group_id)
        except Exception:  # FabricGroup.DoesNotExist, or the database is gone
            await self.accept()
            await self.close(code=CLOSE_UNKNOWN_GROUP)
            return
        self.layer_group = ""  # set once joined
        self.lengths: dict[str, int] = {}
        self.totals: dict[str, Any] = merge.counter_totals({})
        self.backends: list[dict[str, Any]] = []
        self.rejections: dict[str, dict[str, int]] = {}
        self.valkey_error = ""
        self._dirty = asyncio.Event()
        self._refresh_due = False
        await self._join()  # without Valkey, _refresh tries again: the page says why it is not live
        await self.accept()
        await self._refresh()
        await self._send_view()
        self._task = asyncio.create_task(self._pump(), name=f"dashboard:{self.group_id}")
        self._task.add_done_callback(_log_failure)

    async def disconnect(self, code: int) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self.layer_group:
            with contextlib.suppress(*selectors.VALKEY_ERRORS):  # membership expires on its own
                await self.channel_layer.group_discard(self.layer_group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """The browser sends nothing but ``{"type": "refresh"}``, after a pause or resume it saved."""
        if isinstance(content, dict) and content.get("type") == "refresh":
            self._refresh_due = True  # re-read the configuration now, not at the next REFRESH_S
            self._dirty.set()

    async def fabric_snapshot(self, event: publisher.SnapshotEvent) -> None:
        snap = event.get("snapshot")  # checked: the layer is shared, the sender may be another version
        if not isinstance(snap, dict) or "dispatcher_id" not in snap:
            return
        known = self.snapshots.get(snap["dispatcher_id"])
        if known is None or float(snap.get("at", 0)) >= float(known.get("at", 0)):
            self.snapshots[snap["dispatcher_id"]] = snap
        self._dirty.set()

    # --- internals -----------------------------------------------------------------------------
    async def _pump(self) -> None:
        """Coalesced sends on events; a Valkey refresh (counters, dispatchers gone) every REFRESH_S."""
        last_refresh = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), REFRESH_S)
            if self._refresh_due or time.monotonic() - last_refresh >= REFRESH_S:  # even when busy
                last_refresh, self._refresh_due = time.monotonic(), False
                await self._refresh()
            self._dirty.clear()
            try:
                await self._send_view()
            except Exception as exc:  # the socket is going away; disconnect() cancels us
                log.debug("dashboard send failed: %s", exc)
            await asyncio.sleep(MIN_SEND_INTERVAL_S)

    async def _join(self) -> None:
        """Joins the group's channel-layer group, so dispatcher events reach this socket."""
        try:
            await self.channel_layer.group_add(publisher.group_name(self.group_id), self.channel_name)
        except selectors.VALKEY_ERRORS as exc:
            self.valkey_error = str(exc)
            return
        self.layer_group = publisher.group_name(self.group_id)

    async def _refresh(self) -> None:
        started = time.time()
        if not self.layer_group:
            await self._join()
        with contextlib.suppress(Exception):  # keep the last known configuration if the DB hiccups
            self.configured = await database_sync_to_async(selectors.configured_pools)(group_id=self.group_id)
        pool_ids = [p["pool_id"] for p in self.configured]
        try:
            read = await sync_to_async(selectors.fabric_read, thread_sensitive=False)(
                group_id=self.group_id, pool_ids=pool_ids, fairness=selectors.fair_pools(self.configured)
            )
        except selectors.VALKEY_ERRORS as exc:
            self.valkey_error = str(exc)
            return
        self.valkey_error = ""
        self.lengths, self.totals = read["lengths"], read["totals"]
        self.backends, self.rejections = read["backends"], read["rejections"]
        fresh = {str(s.get("dispatcher_id")): s for s in read["snapshots"]}
        # Snapshots that arrived as events while we were reading are newer than what we read.
        for dispatcher_id, snap in self.snapshots.items():
            if float(snap.get("at", 0)) > started and dispatcher_id not in fresh:
                fresh[dispatcher_id] = snap
        self.snapshots = fresh

    def view(self, *, now: float | None = None) -> merge.FabricView:
        now = time.time() if now is None else now
        self.snapshots = merge.live_snapshots(self.snapshots.values(), now=now)
        view = merge.merge_snapshots(self.snapshots.values(), now=now)
        view["valkey_error"] = self.valkey_error
        return merge.finish_view(
            view, group_id=self.group_id, configured=self.configured, queue_lengths=self.lengths,
            totals=self.totals, backends=self.backends, rejections=self.rejections, now=now,
        )  # fmt: skip

    async def _send_view(self) -> None:
        await self.send_json({"type": "fabric.view", "view": self.view()})
        self.sent += 1


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("dashboard feed task failed", exc_info=task.exception())
