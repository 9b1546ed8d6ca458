"""Form uploads as the `openai` SDK sends them, parsed by the standard library."""

from __future__ import annotations

import pytest

from sluicegate.api.multipart import Part, parse_form
from sluicegate.core.errors import GatewayError

BOUNDARY = b"338e01b82a063b6e8bc8b5fe7253ae0a"
CONTENT_TYPE = b"multipart/form-data; boundary=" + BOUNDARY


def form(*parts: bytes) -> bytes:
    """A body laid out byte for byte as httpx (under the `openai` SDK) lays it out."""
    body = b"".join(b"--" + BOUNDARY + b"\r\n" + part + b"\r\n" for part in parts)
    return body + b"--" + BOUNDARY + b"--\r\n"


PURPOSE = b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch'


def upload(content: bytes) -> bytes:
    head = b'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
    return head + b"Content-Type: application/jsonl\r\n\r\n" + content


def test_fields_and_the_file_come_back_byte_for_byte():
    content = b'{"a": 1}\r\n{"b": "\xc3\xa9"}\n\n--not-a-boundary\r\n'
    fields = parse_form(CONTENT_TYPE, form(PURPOSE, upload(content)))
    assert fields == {"purpose": Part(b"batch", None), "file": Part(content, "in.jsonl")}


def test_an_empty_file_is_an_empty_field():
    assert parse_form(CONTENT_TYPE, form(upload(b"")))["file"] == Part(b"", "in.jsonl")


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        (b"application/json", b"{}", "must be multipart/form-data"),
        (b"multipart/form-data", form(PURPOSE), "malformed"),
        (CONTENT_TYPE, b"no parts at all", "malformed"),
        (CONTENT_TYPE, form(b"Content-Disposition: form-data\r\n\r\nx"), "no field name"),
    ],
)
def test_a_body_that_is_not_a_form_is_a_400(content_type, body, message):
    with pytest.raises(GatewayError) as info:
        parse_form(content_type, body)
    assert (info.value.status, info.value.code) == (400, "invalid_request")
    assert message in info.value.message
