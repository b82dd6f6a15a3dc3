"""The peek cache's decoded heads and the lease record a claim writes."""

from __future__ import annotations

import time

from runtime.dispatch.peek import PeekCache
from runtime.policy.cost import CostModel
from runtime.policy.scheduler import HeadItem
from runtime.queue.leases import LeaseRecord
from runtime.wire.contract import ChatCall, Envelope, Metadata

IMAGE = {"type": "image_url", "image_url": {"url": "data:,"}}
ENVELOPE = Envelope(
    request_id="r1",
    producer_id="p1",
    pool_id="docs",
    call=ChatCall.from_openai({"model": "m", "messages": [{"role": "user", "content": [IMAGE, IMAGE]}]}),
    enqueued_at=1_700_000_000.5,
    trace={"traceparent": "00-abc-def-01"},
    metadata=Metadata(page_count=3, labels={"team": "search"}),
)


def test_a_peeked_head_carries_what_the_scheduler_sees() -> None:
    item = PeekCache(CostModel()).get(ENVELOPE.encode())
    assert item.cost == 1 + 2 * 2 + 3  # base, two undeclared image parts, three pages
    assert item.head == HeadItem(cost=item.cost, enqueued_at=ENVELOPE.enqueued_at)


def test_a_malformed_head_has_nothing_for_the_scheduler() -> None:
    item = PeekCache(CostModel()).get(b'{"request_id": "r1"}')
    assert item.envelope is None and item.head is None and item.error


def test_the_claim_writes_the_same_record_as_of_then_encode() -> None:
    fields = {"pool_id": "moved", "claimed_at": time.time(), "dispatcher_id": "d1", "cost": 8}
    raw = LeaseRecord.encode_of(ENVELOPE, **fields)
    assert raw == LeaseRecord.of(ENVELOPE, **fields).encode()
    record = LeaseRecord.decode(raw)
    assert record is not None
    assert (record.pool_id, record.message_count, record.labels) == ("moved", 1, {"team": "search"})
