from __future__ import annotations

import pytest

from sluicegate.api.payloads import parse
from sluicegate.core.errors import GatewayError
from sluicegate.core.types import Endpoint


@pytest.mark.parametrize(
    ("endpoint", "body", "message"),
    [
        (Endpoint.CHAT, b"{not json", "not valid JSON"),
        (Endpoint.CHAT, b"[1, 2]", "must be a JSON object"),
        (Endpoint.CHAT, b'{"messages": []}', "'model' is required"),
        (Endpoint.CHAT, b'{"model": 3, "messages": []}', "'model' is required"),
        (Endpoint.CHAT, b'{"model": "m"}', "'messages' is required"),
        (Endpoint.CHAT, b'{"model": "m", "messages": "hi"}', "non-empty array"),
        (Endpoint.CHAT, b'{"model": "m", "messages": [1]}', "must be an object"),
        (Endpoint.CHAT, b'{"model": "m", "messages": [{}], "stream": "yes"}', "boolean"),
        (Endpoint.COMPLETIONS, b'{"model": "m"}', "'prompt' is required"),
        (Endpoint.EMBEDDINGS, b'{"model": "m", "input": "x", "stream": true}', "does not stream"),
    ],
)
def test_bad_bodies_are_400_with_a_reason(endpoint, body, message):
    with pytest.raises(GatewayError) as info:
        parse(endpoint, body)
    assert info.value.status == 400
    assert message in info.value.message


def test_good_body_is_returned_as_a_dict():
    payload = parse(
        Endpoint.CHAT, b'{"model": "m", "messages": [{"role": "user"}], "stream": true}'
    )
    assert payload["stream"] is True
