from __future__ import annotations

from sluicegate.admission.estimate import chars_over_four, choices, output_tokens, prompt_tokens
from sluicegate.core.types import Endpoint


def chat(**payload: object) -> int:
    return prompt_tokens(Endpoint.CHAT, payload, chars_over_four)


def test_prompt_tokens_are_characters_over_four_rounded_up():
    assert chat(messages=["abcde", [{"type": "text", "text": "abcd"}]]) == 2 + 1 + 1 + 1 + 1
    assert prompt_tokens(Endpoint.COMPLETIONS, {"prompt": ["abcd", "ab"]}, chars_over_four) == 2
    assert prompt_tokens(Endpoint.COMPLETIONS, {"prompt": [1, 2, 3]}, chars_over_four) == 3
    assert prompt_tokens(Endpoint.COMPLETIONS, {"prompt": [[1, 2], [3]]}, chars_over_four) == 3
    assert prompt_tokens(Endpoint.EMBEDDINGS, {"input": "a" * 400}, chars_over_four) == 100


def test_a_prompt_hidden_outside_content_is_counted():
    text = "x" * 4000
    plain = chat(messages=[{"role": "user", "content": "hi"}])
    hidden = [
        {"tools": [{"type": "function", "function": {"name": "f", "description": text}}]},
        {"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": text}}]}]},
        {"messages": [{"role": "user", "name": text, "content": "hi"}]},
        {"messages": [{"role": "user", "content": [{"image_url": {"url": f"data:,{text}"}}]}]},
        {"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": text}]},
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {text: 1}},
    ]
    for payload in hidden:
        assert chat(**payload) >= 1000 + plain, payload


def test_a_plugged_tokenizer_is_used():
    assert (
        prompt_tokens(Endpoint.CHAT, {"messages": [{"c": "a b c"}]}, lambda t: len(t.split())) == 4
    )


def test_deep_nesting_is_counted_without_recursion():
    deep: object = "abcd"
    for _ in range(5000):
        deep = [deep]
    assert chat(messages=deep) == 1


def test_output_reservation_uses_the_request_cap_else_the_routes():
    assert output_tokens(Endpoint.CHAT, {"max_tokens": 7}, 100) == 7
    assert output_tokens(Endpoint.CHAT, {"max_completion_tokens": 9, "max_tokens": 7}, 100) == 9
    assert output_tokens(Endpoint.CHAT, {}, 100) == 100
    assert output_tokens(Endpoint.CHAT, {"max_tokens": True}, 100) == 100
    assert output_tokens(Endpoint.EMBEDDINGS, {"max_tokens": 7}, 100) == 0


def test_n_and_best_of_multiply_the_answers():
    assert choices({}) == 1
    assert choices({"n": 3}) == 3
    assert choices({"n": 2, "best_of": 5}) == 5
    assert choices({"best_of": 4}) == 4
    assert choices({"n": True}) == 1
