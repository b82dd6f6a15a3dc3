"""Snapshot publication: each dispatcher's live snapshot goes out as a Channels event to its group.

``manage.py rundispatcher`` hands :func:`snapshot_sink` to the dispatcher, which calls it with every
changed snapshot (and at least every couple of seconds as a heartbeat). The sink sends one
``fabric.snapshot`` event to the channel-layer group of the fabric group; dashboard websockets of that
group receive it. Like a telemetry exporter it never raises into the dispatcher and never waits long:
a send that takes longer than :data:`SEND_TIMEOUT_S` is abandoned and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from typing import Any, TypedDict

from runtime.dispatch.snapshot import DispatcherSnapshot, SnapshotSink

log = logging.getLogger(__name__)

EVENT_TYPE = "fabric.snapshot"
SEND_TIMEOUT_S = 1.0
WARN_EVERY_S = 30.0
_GROUP_PREFIX = "fabric."
_INVALID = re.compile(r"[^a-zA-Z0-9\-_.]")
_MAX_GROUP_NAME = 99  # channels refuses names of 100 characters or more


class SnapshotEvent(TypedDict):
    """The channel-layer event a dispatcher's snapshot travels in (handled by ``fabric_snapshot``)."""

    type: str
    snapshot: DispatcherSnapshot


def group_name(group_id: str) -> str:
    """The channel-layer group of a fabric group: ``fabric.<group_id>``, sanitized to what channels accepts.

    Characters channels refuses become ``_``; a short hash of the real id keeps two sanitized ids apart.
    """
    clean = _INVALID.sub("_", group_id)
    name = _GROUP_PREFIX + clean
    if clean != group_id or len(name) > _MAX_GROUP_NAME:
        digest = hashlib.sha1(group_id.encode()).hexdigest()[:8]
        name = f"{name[: _MAX_GROUP_NAME - 9]}.{digest}"
    return name


class ChannelLayerSink:
    """Sends snapshots to the channel layer; counts what it could not send instead of raising."""

    def __init__(self, layer: Any, *, timeout_s: float = SEND_TIMEOUT_S) -> None:
        self.layer = layer
        self.timeout_s = timeout_s
        self.sent = 0
        self.failed = 0
        self._last_warning = 0.0

    def __repr__(self) -> str:
        return f"<ChannelLayerSink sent={self.sent} failed={self.failed}>"

    async def __call__(self, snapshot: DispatcherSnapshot) -> None:
        if self.layer is None:
            return
        try:
            group = group_name(str(snapshot["group_id"]))
            event = SnapshotEvent(type=EVENT_TYPE, snapshot=snapshot)
            await asyncio.wait_for(self.layer.group_send(group, event), self.timeout_s)
        except Exception as exc:  # the live feed must never stop dispatch
            self.failed += 1
            now = time.monotonic()
            if now - self._last_warning >= WARN_EVERY_S:
                self._last_warning = now
                log.warning("could not publish a dashboard snapshot (%d failed so far): %r", self.failed, exc)
            return
        self.sent += 1


def snapshot_sink(layer: Any = None) -> SnapshotSink:
    """The dispatcher's snapshot sink, sending through ``layer`` or the project's default channel layer."""
    if layer is None:
        from channels.layers import get_channel_layer

        from pools.connections import configure_channel_layers

        try:
            configure_channel_layers()
            layer = get_channel_layer()
        except Exception as exc:  # no layer: dispatch runs, the dashboard falls back to Valkey snapshots
            log.warning("no channel layer for dashboard snapshots: %s", exc)
            layer = None
    return ChannelLayerSink(layer)
