from __future__ import annotations

import pytest

from sluicegate.providers.backend_metrics import parse_sample

CURRENT = """
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
vllm:num_requests_running{model_name="b"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.25
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{le="+Inf",model_name="a"} 10.0
vllm:inter_token_latency_seconds_count{model_name="a"} 10.0
vllm:inter_token_latency_seconds_sum{model_name="a"} 0.5
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="a"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="a"} 600.0
"""

LEGACY = """
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="a"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="a"} 4.0
vllm:time_per_output_token_seconds_count{model_name="a"} 4.0
vllm:time_per_output_token_seconds_sum{model_name="a"} 0.4
"""


def test_current_names_summed_over_models():
    s = parse_sample(CURRENT)
    assert (s.running, s.waiting, s.kv_usage) == (4.0, 2.0, 0.25)
    assert (s.tpot_sum, s.tpot_count) == (0.5, 10.0)
    assert (s.prefix_queries, s.prefix_hits) == (1000.0, 600.0)


def test_legacy_names():
    s = parse_sample(LEGACY)
    assert (s.running, s.waiting, s.kv_usage) == (1.0, 0.0, 0.5)
    assert (s.tpot_sum, s.tpot_count) == (0.4, 4.0)
    assert (s.prefix_queries, s.prefix_hits) == (None, None)


def test_not_a_vllm_exposition():
    with pytest.raises(ValueError, match="num_requests_waiting"):
        parse_sample("# TYPE up gauge\nup 1\n")


@pytest.mark.parametrize(
    "text",
    [
        'vllm:num_requests_waiting{model_name="x" 1 2 3\n\ufffd }}}\n',
        CURRENT.replace(
            'vllm:num_requests_waiting{model_name="a"} 2.0',
            'vllm:num_requests_waiting{model_name="a"} NaN',
        ),
        CURRENT.replace(
            'vllm:num_requests_running{model_name="b"} 1.0',
            'vllm:num_requests_running{model_name="b"} -9',
        ),
        CURRENT.replace("0.25", "+Inf"),
    ],
)
def test_a_malformed_or_non_finite_scrape_gives_no_sample(text):
    with pytest.raises(ValueError, match=r"."):
        parse_sample(text)
