"""/metrics under vLLM's names, in both generations, parsed as Prometheus text."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import StartSim
from tests.support.processes import Proc

MESSAGES = [{"role": "user", "content": "x" * 40}]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(http: aiohttp.ClientSession, sim: Proc) -> tuple[set[str], Samples]:
    async with http.get(sim.url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/plain")
        text = await resp.text()
    families = list(text_string_to_metric_families(text))
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }
    return {family.name for family in families}, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted({"model_name": "sim-model", **labels}.items()))), 0.0)


async def test_current_generation_counts_tokens_requests_and_latencies(
    sim: Proc, client: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    _, before = await scrape(http, sim)
    for stream in (False, True, False):
        response = await client.chat.completions.create(
            model="sim-model", messages=MESSAGES, max_tokens=4, stream=stream
        )
        if stream:
            _ = [chunk async for chunk in response]  # type: ignore[union-attr]
    names, after = await scrape(http, sim)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
    } <= names
    assert not {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"} & names
    assert delta("vllm:request_success_total", finished_reason="length") == 3
    assert delta("vllm:prompt_tokens_total") == 3 * 10
    assert delta("vllm:generation_tokens_total") == 3 * 4
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:inter_token_latency_seconds_count") == 3 * 3
    assert delta("vllm:request_time_per_output_token_seconds_count") == 3
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    assert delta("vllm:e2e_request_latency_seconds_sum") > 0
    assert value(after, "vllm:num_requests_running") == 0
    assert value(after, "vllm:kv_cache_usage_perc") == 0
    assert value(after, "vllm:inter_token_latency_seconds_bucket", le="+Inf") == value(
        after, "vllm:inter_token_latency_seconds_count"
    )


@pytest.fixture(scope="module")
def legacy_sim(start_sim: StartSim) -> Proc:
    return start_sim("--metrics-generation", "legacy", "--time-scale", "0", "--max-num-seqs", "1")


async def test_legacy_generation_uses_the_older_names(
    legacy_sim: Proc, http: aiohttp.ClientSession
) -> None:
    body = {"model": "sim-model", "prompt": "abcd", "max_tokens": 3}
    async with http.post(legacy_sim.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
    names, samples = await scrape(http, legacy_sim)
    assert {"vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds"} <= names
    assert (
        not {
            "vllm:kv_cache_usage_perc",
            "vllm:inter_token_latency_seconds",
            "vllm:request_time_per_output_token_seconds",
        }
        & names
    )
    assert value(samples, "vllm:time_per_output_token_seconds_count") == 2
    assert value(samples, "vllm:request_success_total", finished_reason="length") == 1


async def test_gauges_show_a_busy_engine(start_sim: StartSim, http: aiohttp.ClientSession) -> None:
    busy = start_sim("--max-num-seqs", "1", "--time-scale", "0.1")
    body = {"model": "sim-model", "prompt": "x" * 4000, "max_tokens": 3000, "stream": True}
    first = await http.post(busy.url + "/v1/completions", json=body)
    # Headers come with the first token, as from vLLM: the second request only queues.
    second = asyncio.ensure_future(http.post(busy.url + "/v1/completions", json=body))
    try:
        await first.content.readline()
        for _ in range(100):
            _, samples = await scrape(http, busy)
            if value(samples, "vllm:num_requests_waiting") == 1:
                break
            await asyncio.sleep(0.01)
        assert value(samples, "vllm:num_requests_running") == 1
        assert value(samples, "vllm:num_requests_waiting") == 1
        assert value(samples, "vllm:kv_cache_usage_perc") == pytest.approx(4000 / 65536, abs=1e-3)
    finally:
        first.close()
        second.cancel()


async def test_prefix_cache_serves_a_continued_answer_and_only_it(
    start_sim: StartSim, http: aiohttp.ClientSession
) -> None:
    """With `--prefix-caching`, an answer sent back to continue (vLLM's
    `continue_final_message`) finds its prompt and its answer so far cached, a distinct
    prompt finds nothing, and the hits are counted under vLLM's names."""
    sim = start_sim("--prefix-caching", "--time-scale", "0")
    client = openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="unused")
    question = [{"role": "user", "content": "a question " * 60}]
    first = await client.chat.completions.create(
        model="sim-model", messages=question, max_tokens=40
    )
    answer = first.choices[0].message.content
    assert answer
    _, before = await scrape(http, sim)
    await client.chat.completions.create(
        model="sim-model",
        messages=[*question, {"role": "assistant", "content": answer}],
        max_tokens=10,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    _, continued = await scrape(http, sim)
    await client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "another " * 80}], max_tokens=4
    )
    _, after = await scrape(http, sim)
    await client.close()
    hits = value(continued, "vllm:prefix_cache_hits_total")
    asked = value(continued, "vllm:prefix_cache_queries_total")
    prompt_tokens = asked - value(before, "vllm:prefix_cache_queries_total")
    assert value(before, "vllm:prefix_cache_hits_total") == 0
    assert prompt_tokens - 16 < hits < prompt_tokens  # all but the last, partial block
    assert value(after, "vllm:prefix_cache_hits_total") == hits
