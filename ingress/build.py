"""Builds the ingress ASGI app from Django settings: the one place the ingress reads configuration."""

from __future__ import annotations

import os
import socket

from asgiref.sync import sync_to_async
from django.conf import settings

from ingress import selectors, services
from ingress.app import Ingress
from ingress.grants import GrantCache
from ingress.models_list import ModelLister
from ops.runtime_settings import producer_settings
from pools.connections import key_space, valkey_url
from runtime.producer import Producer
from runtime.valkey.client import connect


def producer_id() -> str:
    return f"ingress-{socket.gethostname()}-{os.getpid()}"


def make_producer() -> Producer:
    producer_config = producer_settings()
    return Producer(
        connect(valkey_url(), health_s=producer_config.valkey_health_s),
        settings=producer_config,
        keys=key_space(),
        producer_id=producer_id(),
        secrets=os.environ,
    )


async def _lookup(raw_key: str) -> selectors.KeyGrant | None:
    return await sync_to_async(selectors.producer_key_grant, thread_sensitive=False)(raw_key=raw_key)


async def _mark_used(key_id: int) -> None:
    await sync_to_async(services.producer_key_mark_used, thread_sensitive=False)(key_id=key_id)


def build_ingress() -> Ingress:
    return Ingress(
        make_producer=make_producer,
        grants=GrantCache(_lookup, ttl_s=settings.INGRESS_KEY_CACHE_S),
        models=ModelLister(),
        mark_used=_mark_used,
        max_body_bytes=settings.DISPATCH_MAX_ENVELOPE_BYTES,
        default_timeout_s=settings.INGRESS_DEFAULT_TIMEOUT_S,
    )
