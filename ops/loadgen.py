"""Demo traffic: interactive chat, document extraction with images and pages, and backfill bursts.

Each lane is an open-loop Poisson arrival process (so a slow backend builds real queues instead of
slowing the generator down), with a cap on outstanding requests so memory stays bounded.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.errors import DispatchError, ProducerClosed, QueueFull
from runtime.producer import Producer
from runtime.wire.contract import Metadata

CLOSED = ProducerClosed.error_type  # in flight when the load generator stopped: not a failure
REFUSED = QueueFull.error_type  # refused at submit by the pool's admission limits: nothing queued


@dataclass(frozen=True, slots=True)
class Lane:
    pool_id: str
    rate_per_s: float
    make: Callable[[random.Random, int], tuple[dict, Metadata]]
    timeout_s: float = 120.0


def interactive(rng: random.Random, i: int) -> tuple[dict, Metadata]:
    question = rng.choice(["What is DRR?", "Summarise this ticket.", "Translate 'hello'.", "Name a prime."])
    return (
        {
            "model": "sim-model",
            "messages": [{"role": "user", "content": f"{question} #{i}"}],
            "max_tokens": 64,
        },
        Metadata(labels={"lane": "interactive"}),
    )


def document_extract(rng: random.Random, i: int) -> tuple[dict, Metadata]:
    pages, images = rng.randint(1, 12), rng.randint(0, 4)
    parts: list[dict] = [{"type": "text", "text": f"Extract the fields of document {i}."}]
    parts += [
        {"type": "image_url", "image_url": {"url": f"https://example.invalid/doc{i}/p{p}.png"}}
        for p in range(images)
    ]
    return (
        {"model": "sim-model", "messages": [{"role": "user", "content": parts}]},
        Metadata(image_count=images, page_count=pages, labels={"lane": "document"}),
    )


def backfill(rng: random.Random, i: int) -> tuple[dict, Metadata]:
    return (
        {"model": "sim-model", "messages": [{"role": "user", "content": f"Classify record {i}."}]},
        Metadata(cost_units=rng.choice([1, 2, 4]), labels={"lane": "backfill"}),
    )


DEMO_LANES = (
    Lane("interactive", 4.0, interactive, timeout_s=60.0),
    Lane("document-extract", 3.0, document_extract),
    Lane("backfill", 12.0, backfill, timeout_s=600.0),
)


@dataclass(slots=True)
class LoadStats:
    sent: Counter[str] = field(default_factory=Counter)
    ok: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)  # by "pool:error_type"
    wait_s: dict[str, list[float]] = field(default_factory=dict)

    def line(self) -> str:
        parts = []
        for pool in sorted(self.sent):
            waits = sorted(self.wait_s.get(pool, [])[-200:])
            p50 = f"{waits[len(waits) // 2] * 1000:.0f}ms" if waits else "-"
            refused = self.failed[f"{pool}:{REFUSED}"]
            fails = sum(
                v
                for k, v in self.failed.items()
                if k.startswith(pool + ":") and k not in (f"{pool}:{CLOSED}", f"{pool}:{REFUSED}")
            )
            line = f"{pool}: sent {self.sent[pool]} ok {self.ok[pool]} failed {fails} wait p50 {p50}"
            if refused:
                line += f" refused {refused} (queue full)"
            if self.failed[f"{pool}:{CLOSED}"]:
                line += f" cancelled at stop {self.failed[f'{pool}:{CLOSED}']}"
            parts.append(line)
        return " | ".join(parts)


async def run_lane(
    producer: Producer, lane: Lane, stats: LoadStats, *, until: float, max_outstanding: int, seed: int
) -> None:
    rng = random.Random(seed)
    outstanding: set[asyncio.Task[None]] = set()
    i = 0
    while time.monotonic() < until:
        await asyncio.sleep(rng.expovariate(lane.rate_per_s))
        if len(outstanding) >= max_outstanding:
            continue
        call, metadata = lane.make(rng, i)
        i += 1
        task = asyncio.create_task(_one(producer, lane, call, metadata, stats))
        outstanding.add(task)
        task.add_done_callback(outstanding.discard)
    for task in list(outstanding):
        task.cancel()


async def _one(producer: Producer, lane: Lane, call: dict, metadata: Metadata, stats: LoadStats) -> None:
    stats.sent[lane.pool_id] += 1
    try:
        result = await producer.submit(call, pool_id=lane.pool_id, metadata=metadata, timeout=lane.timeout_s)
    except DispatchError as exc:
        stats.failed[f"{lane.pool_id}:{exc.error_type}"] += 1
        return
    stats.ok[lane.pool_id] += 1
    stats.wait_s.setdefault(lane.pool_id, []).append(result.timing.queue_wait_s)
    del stats.wait_s[lane.pool_id][:-1000]
