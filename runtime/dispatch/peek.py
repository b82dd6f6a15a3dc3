"""Decoding of peeked queue items, cached so a head seen in many rounds is decoded once (and, in a
fair pool, its token estimate computed once)."""

from __future__ import annotations

from collections import OrderedDict

from runtime.dispatch.stats import DROP_EXPIRED, DROP_MALFORMED
from runtime.errors import MalformedEnvelope
from runtime.immutable import immutable
from runtime.policy.cost import CostModel, request_cost
from runtime.policy.scheduler import HeadItem
from runtime.policy.tokens import TokenCount
from runtime.wire.contract import Envelope


@immutable
class PeekedItem:
    raw: bytes
    envelope: Envelope | None
    error: str = ""  # why it is malformed
    cost: int = 0
    head: HeadItem | None = None  # what the scheduler sees of it, built once (heads are seen in many rounds)


class PeekCache:
    """Bounded LRU of decoded heads, keyed by length and leading bytes.

    The envelope's first field is its request id, so the prefix identifies an item without hashing
    megabytes of image data every round. A key collision between different items can only make a
    claim miss (its digest is exact); the caller then forgets the entry.
    """

    def __init__(self, cost_model: CostModel, capacity: int = 8192) -> None:
        self.cost_model = cost_model
        self.capacity = capacity
        self._items: OrderedDict[tuple[int, bytes], PeekedItem] = OrderedDict()
        # A fair pool's head is read in every round until it is claimed: its estimate, per pool default.
        self._tokens: dict[tuple[int, bytes], tuple[int, TokenCount, bool]] = {}

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def _key(raw: bytes) -> tuple[int, bytes]:
        return len(raw), raw[:96]

    def get(self, raw: bytes) -> PeekedItem:
        key = self._key(raw)
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
            return item
        item = self._decode(raw)
        self._items[key] = item
        if len(self._items) > self.capacity:
            self._tokens.pop(self._items.popitem(last=False)[0], None)
        return item

    def forget(self, raw: bytes) -> None:
        key = self._key(raw)
        self._items.pop(key, None)
        self._tokens.pop(key, None)

    def estimate(self, raw: bytes, default_output_tokens: int) -> tuple[TokenCount, bool]:
        """A fair pool's view of an item: its token estimate with its pool's default output, and whether
        it is its request's first attempt (only a first attempt is charged at launch). A malformed
        item is estimated at nothing."""
        key = self._key(raw)
        known = self._tokens.get(key)
        if known is not None and known[0] == default_output_tokens:
            return known[1], known[2]
        envelope = self.get(raw).envelope
        if envelope is None:
            return TokenCount(0, 0), False
        estimate = envelope.call.tokens(default_output_tokens)  # an embedding costs its input only
        if key in self._items:  # only what the LRU holds, so this stays as bounded as it
            self._tokens[key] = (default_output_tokens, estimate, envelope.attempt == 1)
        return estimate, envelope.attempt == 1

    def _decode(self, raw: bytes) -> PeekedItem:
        try:
            envelope = Envelope.decode(raw)
        except MalformedEnvelope as exc:
            return PeekedItem(raw, None, error=str(exc))
        md = envelope.metadata
        cost = request_cost(
            self.cost_model,
            cost_units=md.cost_units,
            image_count=md.image_count,
            page_count=md.page_count,
            image_parts=envelope.call.image_parts,
        )
        return PeekedItem(
            raw, envelope, cost=cost, head=HeadItem(cost=cost, enqueued_at=envelope.enqueued_at)
        )


def usable_heads(
    cache: PeekCache, raw_heads: tuple[bytes, ...], now: float
) -> tuple[list[PeekedItem], tuple[PeekedItem, str] | None]:
    """Decoded heads up to the first unusable one (malformed, or past its deadline), and that item
    with its drop reason when it is the very head (only the head can be dropped: claims pop it)."""
    heads: list[PeekedItem] = []
    for raw in raw_heads:
        item = cache.get(raw)
        envelope = item.envelope
        if envelope is None:
            reason = DROP_MALFORMED
        elif envelope.deadline is not None and envelope.deadline <= now:
            reason = DROP_EXPIRED
        else:
            heads.append(item)
            continue
        return heads, None if heads else (item, reason)
    return heads, None
