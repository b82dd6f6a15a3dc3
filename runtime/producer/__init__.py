"""The producer client (see :mod:`runtime.producer.core`): what callers import from ``runtime.producer``."""

from runtime.producer.core import Producer
from runtime.producer.outcomes import CompletionResult, ProducerStats, reply_error
from runtime.producer.pump import ANSWERED_MEMORY, PUMP_BACKOFF_S, REPLY_BATCH, REPLY_BLOCK_S
from runtime.producer.streams import ChatStream
from runtime.producer.sync import SyncProducer

__all__ = [
    "ANSWERED_MEMORY",
    "PUMP_BACKOFF_S",
    "REPLY_BATCH",
    "REPLY_BLOCK_S",
    "ChatStream",
    "CompletionResult",
    "Producer",
    "ProducerStats",
    "SyncProducer",
    "reply_error",
]
