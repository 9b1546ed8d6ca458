from __future__ import annotations

import orjson
import pytest
from openai.types.chat import ChatCompletion

from sluicegate.providers.anthropic_response import cached_tokens, chat_completion, finish_reason


def message(content: list[dict], stop_reason: str = "end_turn", **usage: int) -> dict:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 4, **usage},
    }


def test_text_blocks_become_the_message_content():
    reply = chat_completion(
        message([{"type": "text", "text": "Hello"}, {"type": "text", "text": "!"}]), 7
    )
    assert reply == {
        "id": "msg_1",
        "object": "chat.completion",
        "created": 7,
        "model": "claude-x",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
    }
    ChatCompletion.model_validate(reply)


def test_tool_use_blocks_become_tool_calls_with_json_arguments():
    blocks = [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "toolu_2", "name": "time", "input": {}},
    ]
    reply = chat_completion(message(blocks, "tool_use"), 7)
    parsed = ChatCompletion.model_validate(reply)
    choice = parsed.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    calls = choice.message.tool_calls
    assert [(c.id, c.function.name) for c in calls] == [("toolu_1", "weather"), ("toolu_2", "time")]
    assert orjson.loads(calls[0].function.arguments) == {"city": "Oslo"}
    assert calls[1].function.arguments == "{}"


def test_a_tool_only_answer_has_null_content():
    blocks = [{"type": "tool_use", "id": "t", "name": "now", "input": {}}]
    assert (
        chat_completion(message(blocks, "tool_use"), 0)["choices"][0]["message"]["content"] is None
    )


def test_cached_input_tokens_count_as_prompt_tokens():
    reply = chat_completion(
        message([], cache_creation_input_tokens=5, cache_read_input_tokens=20), 0
    )
    assert reply["usage"] == {"prompt_tokens": 35, "completion_tokens": 4, "total_tokens": 39}
    assert cached_tokens({"cache_read_input_tokens": 20}) == 20
    assert cached_tokens({"input_tokens": 20}) is None


@pytest.mark.parametrize(
    ("stop_reason", "expected"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("something_new", "stop"),
        (None, "stop"),
    ],
)
def test_stop_reasons_map_to_finish_reasons(stop_reason, expected):
    assert finish_reason(stop_reason) == expected


def test_a_body_out_of_shape_raises_for_the_adapter_to_report():
    with pytest.raises(KeyError):
        chat_completion({"id": "x"}, 0)
