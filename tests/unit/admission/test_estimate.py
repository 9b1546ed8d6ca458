from __future__ import annotations

from sluicegate.admission.estimate import chars_over_four, output_tokens, prompt_tokens
from sluicegate.core.types import Endpoint


def test_prompt_tokens_are_characters_over_four_rounded_up():
    payload = {"messages": [{"content": "abcde"}, {"content": [{"type": "text", "text": "abcd"}]}]}
    assert prompt_tokens(Endpoint.CHAT, payload, chars_over_four) == 3
    assert prompt_tokens(Endpoint.COMPLETIONS, {"prompt": ["abcd", "ab"]}, chars_over_four) == 2
    assert prompt_tokens(Endpoint.COMPLETIONS, {"prompt": [1, 2, 3]}, chars_over_four) == 3
    assert prompt_tokens(Endpoint.EMBEDDINGS, {"input": "a" * 400}, chars_over_four) == 100


def test_a_plugged_tokenizer_is_used():
    assert (
        prompt_tokens(Endpoint.CHAT, {"messages": [{"content": "a b c"}]}, lambda t: len(t.split()))
        == 3
    )


def test_output_reservation_uses_the_request_cap_else_the_routes():
    assert output_tokens(Endpoint.CHAT, {"max_tokens": 7}, 100) == 7
    assert output_tokens(Endpoint.CHAT, {"max_completion_tokens": 9, "max_tokens": 7}, 100) == 9
    assert output_tokens(Endpoint.CHAT, {}, 100) == 100
    assert output_tokens(Endpoint.CHAT, {"max_tokens": True}, 100) == 100
    assert output_tokens(Endpoint.EMBEDDINGS, {"max_tokens": 7}, 100) == 0
