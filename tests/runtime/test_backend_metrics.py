"""Tests for runtime.backends.metrics: vLLM and SGLang /metrics text into a BackendLoad."""

from __future__ import annotations

import dataclasses
import itertools
import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.backends.metrics import (
    MAX_LINE,
    MAX_SAMPLES,
    BackendLoad,
    MetricsRefused,
    SampleLines,
    load_from_lines,
    parse_load,
)
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
    assert load.kv_metric == "vllm:kv_cache_usage_perc"


OLD_VLLM = VLLM.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def test_vllm_before_0_10_is_read_by_its_old_kv_name() -> None:
    load = parse_load(OLD_VLLM, kind="vllm", backend_id="b", scraped_at=10.0)
    assert (load.kv_usage, load.kv_metric) == (0.42, "vllm:gpu_cache_usage_perc")
    # Both exported (a transition release): the current name wins.
    both = OLD_VLLM.replace("0.42", "0.99") + VLLM.split("\n", 6)[6]
    load = parse_load(both, kind="vllm", backend_id="b", scraped_at=10.0)
    assert (load.kv_usage, load.kv_metric) == (0.42, "vllm:kv_cache_usage_perc")


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


def gauges(running: str = "1", waiting: str = "0", kv: str = "0.5") -> str:
    return (
        f"vllm:num_requests_running {running}\n"
        f"vllm:num_requests_waiting {waiting}\n"
        f"vllm:kv_cache_usage_perc {kv}\n"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (gauges(running="+Inf"), "vllm:num_requests_running is inf (not a finite number)"),
        (gauges(waiting="NaN"), "vllm:num_requests_waiting is nan (not a finite number)"),
        (gauges(kv="-Inf"), "vllm:kv_cache_usage_perc is -inf (not a finite number)"),
        (gauges(kv="-0.1"), "vllm:kv_cache_usage_perc is -0.1 (negative)"),
        (gauges(running="2e6"), "adds up to 2e+06 requests (absurd: over 1000000)"),
        (gauges(kv="1.5"), "vllm:kv_cache_usage_perc is 1.5, but a KV-cache usage is a fraction"),
        ("vllm:num_requests_running 1\n" * (MAX_SAMPLES + 1), f"over {MAX_SAMPLES} samples"),
        ('vllm:num_requests_running{a="' + "x" * MAX_LINE, f"over {MAX_LINE} bytes long"),
    ],
)
def test_bad_values_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(MetricsRefused, match=re.escape(message)):
        parse_load(text, kind="vllm", backend_id="b", scraped_at=0.0)


def test_a_full_cache_a_hair_over_one_is_clamped_and_counts_are_whole() -> None:
    load = parse_load(gauges(running="2.6", kv="1.004"), kind="vllm", backend_id="b", scraped_at=0.0)
    assert (load.running, load.kv_usage) == (3, 1.0)


def test_other_metrics_are_not_parsed_even_when_broken() -> None:
    text = (
        "garbage{ line\n"
        + "x" * (2 * MAX_LINE)
        + "\nvllm:num_requests_running_total 9\n"
        + gauges(running="4")
    )
    assert parse_load(text, kind="vllm", backend_id="b", scraped_at=0.0).running == 4


@given(cuts=st.lists(st.integers(0, len(VLLM)), max_size=8))
def test_fed_in_any_chunks_the_body_reads_the_same(cuts: list[int]) -> None:
    data = VLLM.encode()
    lines = SampleLines("vllm")
    bounds = [0, *sorted(cuts), len(data)]
    for start, end in itertools.pairwise(bounds):
        lines.feed(data[start:end])
    assert load_from_lines(lines, backend_id="b", scraped_at=10.0) == parse_load(
        VLLM, kind="vllm", backend_id="b", scraped_at=10.0
    )


def test_a_usual_load_reads_in_the_previous_release() -> None:
    """A dispatcher of the previous release builds the load from the fields it knows: the usual load
    carries no others (it would refuse an unknown field, and fall back to max_in_flight)."""
    load = parse_load(VLLM, kind="vllm", backend_id="b", scraped_at=10.0)
    previous = {"backend_id", "scraped_at", "running", "waiting", "kv_usage", "in_flight_at_scrape", "error",
                "scrape_ms"}  # fmt: skip
    assert set(orjson.loads(load.encode())) == previous
    assert BackendLoad.decode(load.encode()) == dataclasses.replace(load, kv_metric="")  # the usual name
    old = parse_load(OLD_VLLM, kind="vllm", backend_id="b", scraped_at=10.0)
    assert BackendLoad.decode(old.encode()).kv_metric == "vllm:gpu_cache_usage_perc"


def test_load_round_trips_through_valkey_bytes() -> None:
    load = BackendLoad("b", 12.5, running=1, waiting=2, kv_usage=0.5, in_flight_at_scrape=3,
                       refused=False, kv_metric="vllm:gpu_cache_usage_perc")  # fmt: skip
    assert BackendLoad.decode(load.encode()) == load
    with pytest.raises(MalformedEnvelope):
        BackendLoad.decode(b"{not json")
