"""Builds stored spans directly (the ingester's row shape) for selector and view tests."""

from __future__ import annotations

import itertools
import time
from typing import Any

from history import schema
from history.client import HistoryClient
from history.ingester import Ingester, span_row
from runtime.telemetry import semconv

_ids = itertools.count(1)


def execution_doc(
    *,
    request_id: str | None = None,
    pool: str = "interactive",
    group: str = "g1",
    producer: str = "prod-1",
    gateway: str = "gw-1",
    status: str = "ok",
    error_type: str = "",
    model: str = "m-small",
    queue_wait: float = 0.1,
    execution: float = 1.0,
    output_tokens: int | None = 100,
    input_tokens: int = 10,
    tenant: str = "",
    ago_s: float = 60.0,
    trace_id: str | None = None,
    attempt: int | None = None,
    start_ns: int | None = None,
) -> dict[str, Any]:
    n = next(_ids)
    start = start_ns if start_ns is not None else time.time_ns() - int(ago_s * 1e9)
    attrs: dict[str, Any] = {
        semconv.REQUEST_ID: request_id or f"req-{n}",
        semconv.POOL_ID: pool,
        semconv.GROUP_ID: group,
        semconv.PRODUCER_ID: producer,
        semconv.GATEWAY_ID: gateway,
        semconv.DISPATCHER_ID: "disp-1",
        semconv.STATUS: status,
        semconv.GEN_AI_REQUEST_MODEL: model,
        semconv.BACKEND_URL: "http://127.0.0.1:9/v1",
        semconv.QUEUE_WAIT_S: queue_wait,
        semconv.TOTAL_S: queue_wait + execution,
    }
    if status != "dropped":
        attrs[semconv.EXECUTION_S] = execution
    if attempt is not None:
        attrs[semconv.ATTEMPT] = attempt
    if error_type:
        attrs[semconv.ERROR_TYPE] = error_type
        attrs[semconv.ERROR_MESSAGE] = f"{error_type} happened"
    if output_tokens is not None:
        attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = output_tokens
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = input_tokens
    if tenant:
        attrs[semconv.TENANT] = tenant
    return {
        "trace_id": trace_id or f"{n:032x}",
        "span_id": f"{n:016x}",
        "parent_span_id": "",
        "name": f"chat {model}",
        "kind": "Client",
        "start_ns": start,
        "end_ns": start + int(execution * 1e9),
        "status_code": "Error" if status == "error" else "Unset",
        "attributes": attrs,
        "resource": {"service.name": "llm-dispatch-dispatcher"},
        "scope": {"name": "llm_dispatch.dispatcher"},
    }


def store(history: HistoryClient, docs: list[dict[str, Any]]) -> None:
    history.insert(schema.TABLE, [span_row(d) for d in docs], schema.INSERT_COLUMNS)


def drain(ingester: Ingester, rounds: int = 50) -> int:
    """Runs ingester rounds until one reads nothing; returns entries acknowledged."""
    total = 0
    for _ in range(rounds):
        got = ingester.step()
        total += got
        if not got:
            break
    return total
