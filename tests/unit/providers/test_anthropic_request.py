from __future__ import annotations

import pytest

from sluicegate.core.errors import GatewayError
from sluicegate.providers.anthropic_request import (
    DEFAULT_MAX_TOKENS,
    include_usage,
    messages_request,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Forecast for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_system_messages_move_to_the_top_level_and_are_joined():
    request = messages_request(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "No lists."}]},
                {"role": "user", "content": "hi"},
            ],
            "max_tokens": 10,
        },
        "claude-x",
    )
    assert request == {
        "model": "claude-x",
        "max_tokens": 10,
        "system": "Be brief.\n\nNo lists.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


def test_max_tokens_prefers_max_completion_tokens_and_defaults_when_absent():
    messages = [{"role": "user", "content": "hi"}]
    both = {"messages": messages, "max_tokens": 9, "max_completion_tokens": 7}
    assert messages_request(both, "m")["max_tokens"] == 7
    assert messages_request({"messages": messages}, "m")["max_tokens"] == DEFAULT_MAX_TOKENS


def test_sampling_options_map_and_temperature_is_clamped_to_anthropic_range():
    request = messages_request(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 1.6,
            "top_p": 0.9,
            "stop": "END",
            "stream": True,
            "user": "u-1",
            "presence_penalty": 0.5,
        },
        "m",
    )
    assert request["temperature"] == 1.0
    assert request["top_p"] == 0.9
    assert request["stop_sequences"] == ["END"]
    assert request["stream"] is True
    assert request["metadata"] == {"user_id": "u-1"}
    assert "presence_penalty" not in request
    listed = messages_request({"messages": [{"role": "user", "content": "x"}], "stop": ["a"]}, "m")
    assert listed["stop_sequences"] == ["a"]


def test_tool_calls_and_results_become_blocks_with_results_merged_in_one_user_turn():
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
        },
        {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": ""}},
    ]
    request = messages_request(
        {
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"},
                {
                    "role": "tool",
                    "tool_call_id": "c2",
                    "content": [{"type": "text", "text": "sun"}],
                },
                {"role": "user", "content": "Thanks"},
            ],
            "tools": [WEATHER],
        },
        "m",
    )
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "c2", "name": "weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "sun"},
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    assert request["tools"] == [
        {
            "name": "weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            "description": "Forecast for a city",
        }
    ]
    assert "tool_choice" not in request


def test_a_tool_without_parameters_gets_an_empty_object_schema():
    bare = {"type": "function", "function": {"name": "now"}}
    request = messages_request(
        {"messages": [{"role": "user", "content": "x"}], "tools": [bare]}, "m"
    )
    assert request["tools"] == [
        {"name": "now", "input_schema": {"type": "object", "properties": {}}}
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        (
            {"type": "function", "function": {"name": "weather"}},
            {"type": "tool", "name": "weather"},
        ),
    ],
)
def test_tool_choice_maps_to_anthropic_equivalent(choice, expected):
    payload = {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [WEATHER],
        "tool_choice": choice,
    }
    assert messages_request(payload, "m")["tool_choice"] == expected


def test_parallel_tool_calls_false_disables_parallel_tool_use():
    payload = {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [WEATHER],
        "parallel_tool_calls": False,
    }
    assert messages_request(payload, "m")["tool_choice"] == {
        "type": "auto",
        "disable_parallel_tool_use": True,
    }
    payload["tool_choice"] = "none"
    assert messages_request(payload, "m")["tool_choice"] == {"type": "none"}


def test_images_map_to_base64_or_url_sources():
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]
    request = messages_request({"messages": [{"role": "user", "content": parts}]}, "m")
    assert request["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"n": 2}, "unsupported_by_provider"),
        ({"logprobs": True}, "unsupported_by_provider"),
        ({"response_format": {"type": "json_object"}}, "unsupported_by_provider"),
        ({"tools": [{"type": "web_search"}]}, "unsupported_by_provider"),
        ({"tool_choice": "sometimes"}, "invalid_request"),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "unsupported_by_provider",
        ),
        ({"messages": [{"role": "function", "content": "x"}]}, "invalid_request"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "invalid_request"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"arguments": "[1]"}}]}
                ]
            },
            "invalid_request",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{"}}]}]},
            "invalid_request",
        ),
    ],
)
def test_requests_the_messages_api_cannot_express_are_refused_with_400(extra, code):
    payload = {"messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(GatewayError) as caught:
        messages_request(payload, "m")
    assert (caught.value.status, caught.value.code) == (400, code)


def test_include_usage_reads_stream_options():
    assert include_usage({"stream_options": {"include_usage": True}})
    assert not include_usage({"stream_options": {"include_usage": False}})
    assert not include_usage({})


def deep_arguments(depth: int) -> dict:
    """A conversation whose tool call's arguments, a JSON string, nest `depth` levels."""
    arguments = '{"a": ' * depth + "1" + "}" * depth
    call = {"id": "t1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        ]
    }


@pytest.mark.parametrize("depth", [200, 1000])
def test_tool_call_arguments_nested_too_deep_to_send_are_a_400(depth):
    """The arguments string parses (orjson reads 1,024 levels) but the request holding it
    could not be written (254): refused as the caller's, not failed as the gateway's."""
    with pytest.raises(GatewayError) as info:
        messages_request(deep_arguments(depth), "m")
    assert info.value.status == 400
    assert "deeper than" in info.value.message
    assert messages_request(deep_arguments(100), "m")["messages"][1]["content"][0]["input"]
