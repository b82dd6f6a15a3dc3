"""``GET /v1/models``: the model list of the backend behind the key's default pool, cached briefly."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx

from ingress.errors import ApiError
from runtime.backends.redact import redact_url, scrub_address, strip_userinfo
from runtime.producer import Producer

log = logging.getLogger(__name__)
CACHE_S = 30.0


class ModelLister:
    def __init__(self, *, secrets: Mapping[str, str] = os.environ, timeout_s: float = 10.0) -> None:
        self.secrets = secrets
        self.timeout_s = timeout_s
        self._cache: dict[str, tuple[float, dict[str, Any]]] = {}

    async def list(self, producer: Producer, pool_id: str) -> dict[str, Any]:
        group = await producer.pool_group(pool_id)
        endpoint = group.endpoint_for(pool_id) if group is not None else ""
        if not endpoint:
            raise ApiError(
                503, f"pool {pool_id!r} has no backend endpoint", "service_unavailable", "no_backend"
            )
        cached = self._cache.get(endpoint)
        if cached is not None and time.monotonic() - cached[0] < CACHE_S:
            return cached[1]
        headers = {}
        key_env = group.api_key_env_for(pool_id) if group is not None else ""
        api_key = self.secrets.get(key_env) if key_env else None
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        url = strip_userinfo(endpoint).rstrip("/") + "/models"
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                response = await client.get(url, headers=headers)
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            # The details name the backend's address: the operator's log gets them, the client does not.
            detail = scrub_address(str(exc), endpoint, (api_key,) if api_key else ())
            shown = redact_url(endpoint)
            log.warning("the backend of pool %r (%s) did not list its models: %s", pool_id, shown, detail)
            raise ApiError(
                503, f"the backend of pool {pool_id!r} did not list its models", "service_unavailable",
                "no_backend",
            ) from exc  # fmt: skip
        self._cache[endpoint] = (time.monotonic(), body)
        return body
