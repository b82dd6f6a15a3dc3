"""Issue 24: the load of llama.cpp's llama-server and of Hugging Face TGI, read from their own names.

The texts below are written from each server's documentation (llama.cpp's server README, "/metrics";
TGI's metrics reference) with their HELP/TYPE lines and their labels (none on either server's gauges),
and the simulator is checked to export the same names, so the gate is tested against what the real
servers send and the end-to-end tests against a simulator that sends it too.
"""

from __future__ import annotations

import re

import aiohttp
import pytest

from runtime.backends.breaker import BreakerState
from runtime.backends.metrics import (
    METRIC_NAMES,
    BackendLoad,
    MetricsRefused,
    SampleLines,
    gauges_read,
    load_from_lines,
    parse_load,
)
from runtime.backends.status import backend_status
from runtime.wire.backendconfig import KINDS, BackendConfig, default_metrics_url
from simulator.config import SimulatorConfig
from simulator.server import SimulatorServer

# llama-server --metrics, before llama.cpp dropped its KV-cache gauges (2025): no labels at all.
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 33065
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 235.743
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 7801
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 301.2
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 140.26
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 25.9
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.63
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 2580
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

# A current llama-server: the KV-cache gauges are gone (llama.cpp PR 13660).
LLAMACPP_NO_KV = "".join(line + "\n" for line in LLAMACPP.splitlines() if "kv_cache" not in line)

# TGI's router (metrics-exporter-prometheus): gauges without labels, histograms labelled by method.
TGI = """\
# HELP tgi_request_count Total number of requests
# TYPE tgi_request_count counter
tgi_request_count 812
# HELP tgi_request_success Number of successful requests
# TYPE tgi_request_success counter
tgi_request_success 790
# HELP tgi_queue_size Current queue size
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# HELP tgi_batch_current_size Current batch size
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# HELP tgi_batch_current_max_tokens Maximum tokens for the current batch
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 9216
# HELP tgi_batch_inference_duration Batch inference duration
# TYPE tgi_batch_inference_duration histogram
tgi_batch_inference_duration_bucket{method="prefill",le="0.005"} 0
tgi_batch_inference_duration_bucket{method="prefill",le="+Inf"} 40
tgi_batch_inference_duration_sum{method="prefill"} 3.1
tgi_batch_inference_duration_count{method="prefill"} 40
# HELP tgi_batch_next_size Batch size of the next batch
# TYPE tgi_batch_next_size histogram
tgi_batch_next_size_bucket{le="1"} 3
tgi_batch_next_size_bucket{le="+Inf"} 40
tgi_batch_next_size_sum 120
tgi_batch_next_size_count 40
"""


def read(text: str, kind: str) -> tuple[BackendLoad, list[str]]:
    lines = SampleLines(kind)
    lines.feed(text.encode())
    return load_from_lines(lines, backend_id="b", scraped_at=10.0), gauges_read(lines)


def test_llamacpp_reads_processing_deferred_and_the_kv_ratio() -> None:
    load, read_names = read(LLAMACPP, "llamacpp")
    assert (load.running, load.waiting, load.kv_usage, load.kv_exported) == (4, 2, 0.63, True)
    assert load.kv_metric == "llamacpp:kv_cache_usage_ratio"
    assert read_names == [
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:kv_cache_usage_ratio",
    ]


def test_a_current_llama_server_without_kv_gauge_is_gated_on_its_requests_alone() -> None:
    load, read_names = read(LLAMACPP_NO_KV, "llamacpp")
    assert (load.running, load.waiting, load.kv_usage, load.kv_exported, load.kv_metric) == (
        4,
        2,
        0.0,
        False,
        "",
    )
    assert read_names == ["llamacpp:requests_processing", "llamacpp:requests_deferred"]
    # The shared load says so, and the admin line does not invent a KV usage.
    assert BackendLoad.decode(load.encode()) == load
    config = BackendConfig("b", "http://gpu:8080/v1", kind="llamacpp")
    status = backend_status(config, load, 0, BreakerState(), now=10.0)
    assert status.kv_usage is None and status.kv_metric == ""
    assert "running 4, waiting 2, no KV gauge" in status.describe()


def test_tgi_reads_batch_size_as_running_and_queue_size_as_waiting() -> None:
    load, read_names = read(TGI, "tgi")
    assert (load.running, load.waiting, load.kv_exported) == (12, 3, False)
    assert read_names == ["tgi_batch_current_size", "tgi_queue_size"]
    status = backend_status(BackendConfig("b", "http://tgi/v1", kind="tgi"), load, 0, BreakerState(), 10.0)
    assert "running 12, waiting 3, no KV gauge" in status.describe()


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        (TGI, "llamacpp", "lack llamacpp:requests_processing, llamacpp:requests_deferred"),
        (LLAMACPP, "tgi", "lack tgi_batch_current_size, tgi_queue_size"),
        # The vLLM KV gauge stays required: a vLLM server always exports one.
        (
            "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n",
            "vllm",
            "lack vllm:kv_cache_usage_perc",
        ),
        (LLAMACPP.replace("ratio 0.63", "ratio 7"), "llamacpp", "kv_cache_usage_ratio is 7"),
        (TGI.replace("tgi_queue_size 3", "tgi_queue_size -1"), "tgi", "tgi_queue_size is -1 (negative)"),
    ],
)
def test_a_wrong_kind_or_a_bad_value_is_refused_with_the_reason(text: str, kind: str, message: str) -> None:
    with pytest.raises(MetricsRefused, match=re.escape(message)):
        parse_load(text, kind=kind, backend_id="b", scraped_at=0.0)


def test_the_old_release_decodes_the_usual_load_and_a_no_kv_load_is_marked() -> None:
    """kv_exported is sent only when False (as refused only when True): a load with a KV gauge is
    encoded with the previous release's fields."""
    with_kv, _ = read(LLAMACPP, "llamacpp")
    assert b"kv_exported" not in with_kv.encode() and b"kv_metric" not in with_kv.encode()
    without, _ = read(TGI, "tgi")
    assert b'"kv_exported":false' in without.encode()


def test_every_kind_with_metrics_is_one_the_backend_row_offers() -> None:
    assert set(METRIC_NAMES) == set(KINDS) - {"openai"}


@pytest.mark.parametrize("kind", ["vllm", "sglang", "llamacpp", "tgi"])
async def test_the_simulator_exports_each_kinds_names_over_http(kind: str) -> None:
    async with SimulatorServer(SimulatorConfig(kind=kind, kv_cache_tokens=1000)) as sim:
        status, text = await get_metrics(sim)
    assert status == 200
    load, read_names = read(text, kind)
    names = METRIC_NAMES[kind]
    assert read_names == [names.running, names.waiting, *names.kv_usage[:1]]  # the current KV name
    assert (load.running, load.waiting, load.kv_exported) == (0, 0, kind != "tgi")
    labelled = kind in ("vllm", "sglang")
    assert (f'{names.running}{{model_name="sim-model"}}' in text) == labelled


async def test_the_simulator_as_a_plain_openai_server_has_no_metrics() -> None:
    async with SimulatorServer(SimulatorConfig(kind="openai")) as sim:
        status, _ = await get_metrics(sim)
    assert status == 404


async def get_metrics(sim: SimulatorServer) -> tuple[int, str]:
    """The simulator's /metrics over real HTTP, where a scraper finds it (beside /v1)."""
    async with aiohttp.ClientSession() as http, http.get(default_metrics_url(sim.url)) as response:
        return response.status, await response.text()
