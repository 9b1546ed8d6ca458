"""Request bodies as the engine sees them."""

from __future__ import annotations

from typing import Any

from sluicegate.sim.protocol import parse_chat, parse_completion


def chat_text(payload: dict[str, Any]) -> str:
    text = parse_chat({"model": "m", **payload}, 8, rendered=True).text
    assert text is not None
    return text


def completion_text(payload: dict[str, Any]) -> str:
    text = parse_completion({"model": "m", **payload}, 8, rendered=True).text
    assert text is not None
    return text


QUESTION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}]


def test_an_answer_sent_back_to_continue_renders_as_the_question_and_that_answer() -> None:
    """What the prefix cache keeps of an answer (the question's text, then the answer)
    is what its continuation's prompt begins with, to its last character; a plain
    follow-up opens a new answer after it instead."""
    partial = " lorem ipsum"
    continued = {
        "messages": [*QUESTION, {"role": "assistant", "content": partial}],
        "continue_final_message": True,
    }
    assert chat_text(continued) == chat_text({"messages": QUESTION}) + partial
    follow_up = {**continued, "continue_final_message": False}
    assert chat_text(follow_up) == chat_text(continued) + "<|assistant|>"


def test_text_parts_render_as_their_text_and_completions_as_their_prompts() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert chat_text({"messages": [{"role": "user", "content": parts}]}) == (
        "<|user|>ab<|assistant|>"
    )
    assert completion_text({"prompt": ["one", "two"]}) == "onetwo"


def test_a_cache_salt_keys_the_prompt_so_no_other_salt_shares_its_blocks() -> None:
    """As vLLM's `cache_salt`: the same prompt under two salts shares no block, under
    one salt or none it is the same text as before."""
    plain = chat_text({"messages": QUESTION})
    salted = chat_text({"messages": QUESTION, "cache_salt": "tenant-a"})
    other = chat_text({"messages": QUESTION, "cache_salt": "tenant-b"})
    assert salted.endswith(plain)
    assert salted[:16] != other[:16] != plain[:16]
    assert chat_text({"messages": QUESTION, "cache_salt": "tenant-a"}) == salted
    assert completion_text({"prompt": "p", "cache_salt": "s"}).endswith("p")
