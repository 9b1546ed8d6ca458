from __future__ import annotations

import orjson
import pytest

from sluicegate.api.asgi import error_body
from sluicegate.api.intake import Intake
from sluicegate.api.payloads import MAX_DEPTH, parse
from sluicegate.config.loader import parse_settings
from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Endpoint
from tests.support.clock import FakeClock


@pytest.mark.parametrize(
    ("endpoint", "body", "message", "param"),
    [
        (Endpoint.CHAT, b"{not json", "not valid JSON", None),
        (Endpoint.CHAT, b"[1, 2]", "must be a JSON object", None),
        (Endpoint.CHAT, b'{"messages": []}', "'model' is required", "model"),
        (Endpoint.CHAT, b'{"model": 3, "messages": []}', "'model' is required", "model"),
        (Endpoint.CHAT, b'{"model": "m"}', "'messages' is required", "messages"),
        (Endpoint.CHAT, b'{"model": "m", "messages": "hi"}', "non-empty array", "messages"),
        (Endpoint.CHAT, b'{"model": "m", "messages": [1]}', "must be an object", "messages"),
        (Endpoint.CHAT, b'{"model": "m", "messages": [{}], "stream": "yes"}', "boolean", "stream"),
        (Endpoint.COMPLETIONS, b'{"model": "m"}', "'prompt' is required", "prompt"),
        (
            Endpoint.EMBEDDINGS,
            b'{"model": "m", "input": "x", "stream": true}',
            "does not stream",
            "stream",
        ),
    ],
)
def test_bad_bodies_are_400_with_a_reason_naming_the_field(endpoint, body, message, param):
    with pytest.raises(GatewayError) as info:
        parse(endpoint, body)
    assert info.value.status == 400
    assert message in info.value.message
    assert info.value.param == param
    assert orjson.loads(error_body(info.value))["error"]["param"] == param


def test_good_body_is_returned_as_a_dict():
    payload = parse(
        Endpoint.CHAT, b'{"model": "m", "messages": [{"role": "user"}], "stream": true}'
    )
    assert payload["stream"] is True


def nested(depth: int) -> bytes:
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return b'{"model": "m", "messages": [{}], "x": ' + inner + b"}"


def test_nesting_the_gateway_could_not_send_on_is_a_400():
    assert parse(Endpoint.CHAT, nested(MAX_DEPTH))["model"] == "m"
    for depth in (MAX_DEPTH + 1, 300, 1000):
        with pytest.raises(GatewayError) as info:
            parse(Endpoint.CHAT, nested(depth))
        assert info.value.status == 400
        assert "deeper than" in info.value.message


def test_brackets_inside_strings_are_not_nesting():
    body = b'{"model": "m", "messages": [{"content": "' + b"[{" * 500 + b'"}]}'
    assert parse(Endpoint.CHAT, body)["messages"][0]["content"].startswith("[{")


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n", "best_of"])
@pytest.mark.parametrize("value", ['"100"', "1.5", "true", "-1", "[1]", "1e3"])
def test_token_fields_must_be_integers(field, value):
    body = f'{{"model": "m", "messages": [{{}}], "{field}": {value}}}'.encode()
    with pytest.raises(GatewayError) as info:
        parse(Endpoint.CHAT, body)
    assert info.value.status == 400
    assert f"'{field}' must be an integer from 0 to {2**31 - 1}" in info.value.message
    assert info.value.param == field


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n", "best_of"])
@pytest.mark.parametrize("value", [2**31, 2**63])
def test_token_counts_past_32_bits_are_a_400(field, value):
    """No model reads that many; sums of such counts would pass what the pools' and
    tenants' token figures hold exactly."""
    body = f'{{"model": "m", "messages": [{{}}], "{field}": {value}}}'.encode()
    with pytest.raises(GatewayError) as info:
        parse(Endpoint.CHAT, body)
    assert info.value.status == 400
    assert f"'{field}' must be an integer from 0 to {2**31 - 1}" in info.value.message


def test_integer_and_null_token_fields_pass():
    body = b'{"model": "m", "messages": [{}], "max_tokens": 5, "n": null, "best_of": 0}'
    assert parse(Endpoint.CHAT, body)["max_tokens"] == 5
    largest = f'{{"model": "m", "messages": [{{}}], "max_tokens": {2**31 - 1}}}'.encode()
    assert parse(Endpoint.CHAT, largest)["max_tokens"] == 2**31 - 1


def chat_with(turns: int) -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user"}] * turns})


def test_more_messages_than_the_route_allows_is_a_400_naming_the_limit():
    assert len(parse(Endpoint.CHAT, chat_with(4), max_messages=4)["messages"]) == 4
    with pytest.raises(GatewayError) as info:
        parse(Endpoint.CHAT, chat_with(5), max_messages=4)
    err = info.value
    assert (err.status, err.param) == (400, "messages")
    assert "5 messages" in err.message
    assert "at most 4" in err.message


def test_a_job_is_held_to_its_routes_message_limit():
    raw = {
        "routes": {"chat": {"max_messages": 2}},
        "models": [
            {
                "name": "m",
                "deployments": [{"name": "d", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
            }
        ],
        "tenants": [{"name": "a", "keys": [{"env": "A_KEY"}]}],
    }
    settings = parse_settings(raw, "test", {"A_KEY": "sk-a"})
    intake = Intake(settings, FakeClock(), lambda: None)
    body = orjson.loads(chat_with(3))
    with pytest.raises(GatewayError) as info:
        intake.request(settings.tenants[0], Endpoint.CHAT, body)
    assert "at most 2" in info.value.message
