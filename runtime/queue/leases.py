"""What a dispatcher stores with each in-flight lease, so that a lost call still leaves a trace.

In ``lists`` mode a request that was popped is no longer durable: if its dispatcher dies, the lease
expires and the request is gone. The claim stores this record beside the lease; whoever reaps the
expired lease reads it back, counts the request as ``lost_in_flight`` for its pool and writes a
dropped span with the request's identity, timing and trace context.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import field
from typing import Any

import orjson

from runtime.immutable import immutable
from runtime.telemetry.spans import Subject
from runtime.wire.contract import Envelope


@immutable
class LeaseRecord:
    request_id: str
    producer_id: str
    pool_id: str  # the lane it was claimed from (the list it sat in)
    model: str
    message_count: int
    enqueued_at: float
    claimed_at: float
    dispatcher_id: str
    cost: int = 0
    trace: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    # Set (durable mode) once a chunk of the call reached its producer: the request is not requeued
    # then; whoever reaps the expired lease answers it with ``stream_interrupted`` instead.
    streamed: bool = False
    tenant: str | None = None  # issue 22; None: untagged (a record of one encodes no field)
    operation: str = "chat"  # the GenAI operation; a chat record encodes no field, as before

    @classmethod
    def of(
        cls, envelope: Envelope, *, pool_id: str, claimed_at: float, dispatcher_id: str, cost: int
    ) -> LeaseRecord:
        return cls(
            request_id=envelope.request_id,
            producer_id=envelope.producer_id,
            pool_id=pool_id,
            model=envelope.call.model,
            message_count=envelope.call.message_count,
            enqueued_at=envelope.enqueued_at,
            claimed_at=claimed_at,
            dispatcher_id=dispatcher_id,
            cost=cost,
            trace=dict(envelope.trace),
            labels=dict(envelope.metadata.labels),
            tenant=envelope.tenant,
            operation=envelope.call.operation,
        )

    @staticmethod
    def encode_of(
        envelope: Envelope, *, pool_id: str, claimed_at: float, dispatcher_id: str, cost: int
    ) -> bytes:
        """``of(...).encode()`` without building the record: the claim of every launch writes one."""
        return orjson.dumps(
            {
                "request_id": envelope.request_id,
                "producer_id": envelope.producer_id,
                "pool_id": pool_id,
                "model": envelope.call.model,
                "message_count": envelope.call.message_count,
                "enqueued_at": envelope.enqueued_at,
                "claimed_at": claimed_at,
                "dispatcher_id": dispatcher_id,
                "cost": cost,
                "trace": dict(envelope.trace),
                "labels": dict(envelope.metadata.labels),
                **({"tenant": envelope.tenant} if envelope.tenant is not None else {}),
                **({"operation": envelope.call.operation} if envelope.call.operation != "chat" else {}),
            }
        )

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "request_id": self.request_id,
                "producer_id": self.producer_id,
                "pool_id": self.pool_id,
                "model": self.model,
                "message_count": self.message_count,
                "enqueued_at": self.enqueued_at,
                "claimed_at": self.claimed_at,
                "dispatcher_id": self.dispatcher_id,
                "cost": self.cost,
                "trace": dict(self.trace),
                "labels": dict(self.labels),
                **({"streamed": True} if self.streamed else {}),
                **({"tenant": self.tenant} if self.tenant is not None else {}),
                **({"operation": self.operation} if self.operation != "chat" else {}),
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> LeaseRecord | None:
        """The record, or None when the bytes are not one (written by another version)."""
        try:
            data: Any = orjson.loads(raw)
            return cls(
                request_id=str(data["request_id"]),
                producer_id=str(data["producer_id"]),
                pool_id=str(data["pool_id"]),
                model=str(data["model"]),
                message_count=int(data["message_count"]),
                enqueued_at=float(data["enqueued_at"]),
                claimed_at=float(data["claimed_at"]),
                dispatcher_id=str(data["dispatcher_id"]),
                cost=int(data.get("cost", 0)),
                trace={str(k): str(v) for k, v in dict(data.get("trace") or {}).items()},
                labels={str(k): str(v) for k, v in dict(data.get("labels") or {}).items()},
                streamed=data.get("streamed") is True,
                tenant=str(data["tenant"]) if isinstance(data.get("tenant"), str) else None,
                operation=str(data.get("operation") or "chat"),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    def subject(self) -> Subject:
        return Subject(
            request_id=self.request_id,
            producer_id=self.producer_id,
            pool_id=self.pool_id,
            model=self.model,
            message_count=self.message_count,
            enqueued_at=self.enqueued_at,
            trace=self.trace,
            labels=self.labels,
            tenant=self.tenant,
            operation=self.operation,
        )


def item_digest(raw: bytes) -> str:
    """The SHA-1 the claim script compares against ``redis.sha1hex`` of the list head."""
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()


def lease_member(pool_id: str, request_id: str) -> str:
    """A request's lease member: its pool first (REAP and admission read it back up to the \\x1f)."""
    return f"{pool_id}\x1f{request_id}"
