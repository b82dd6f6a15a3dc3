"""Tests for runtime.backends.metrics: vLLM and SGLang /metrics text into a BackendLoad."""

from __future__ import annotations

import pytest

from runtime.backends.metrics import BackendLoad, parse_load
from runtime.errors import MalformedEnvelope

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m"} 1234.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0
sglang:num_running_reqs{model_name="m",tp_rank="1"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1.0
sglang:num_queue_reqs{model_name="m",tp_rank="1"} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.3
sglang:token_usage{model_name="m",tp_rank="1"} 0.9
"""


def test_vllm_gauges() -> None:
    load = parse_load(VLLM, kind="vllm", backend_id="b", scraped_at=10.0)
    assert (load.running, load.waiting, load.kv_usage, load.ok) == (4, 7, 0.42, True)


def test_sglang_sums_ranks_and_takes_the_fullest_kv_cache() -> None:
    load = parse_load(SGLANG, kind="sglang", backend_id="b", scraped_at=10.0)
    assert (load.running, load.waiting, load.kv_usage) == (5, 1, 0.9)


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        (VLLM, "sglang", "lack sglang:num_running_reqs"),
        ("", "vllm", "lack vllm:num_requests_running"),
        (VLLM, "openai", "exports no load metrics"),
        ("vllm:num_requests_running{ 4\n", "vllm", "unreadable Prometheus text"),
    ],
)
def test_unusable_text_is_a_clear_error(text: str, kind: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_load(text, kind=kind, backend_id="b", scraped_at=0.0)


def test_load_round_trips_through_valkey_bytes() -> None:
    load = BackendLoad("b", 12.5, running=1, waiting=2, kv_usage=0.5, in_flight_at_scrape=3)
    assert BackendLoad.decode(load.encode()) == load
    with pytest.raises(MalformedEnvelope):
        BackendLoad.decode(b"{not json")
