"""Form uploads as the `openai` SDK sends them, parsed as they stream in."""

from __future__ import annotations

import logging
import tracemalloc

import pytest

from sluicegate.api.multipart import FormReader, Part
from sluicegate.core.errors import GatewayError
from sluicegate.jobs.chunks import CHUNK_BYTES

BOUNDARY = b"338e01b82a063b6e8bc8b5fe7253ae0a"
CONTENT_TYPE = b"multipart/form-data; boundary=" + BOUNDARY


def form(*parts: bytes) -> bytes:
    """A body laid out byte for byte as httpx (under the `openai` SDK) lays it out."""
    body = b"".join(b"--" + BOUNDARY + b"\r\n" + part + b"\r\n" for part in parts)
    return body + b"--" + BOUNDARY + b"--\r\n"


def parse_form(content_type: bytes, body: bytes, chunk: int = 65_536) -> dict[str, Part]:
    reader = FormReader(content_type)
    for start in range(0, len(body), chunk):
        reader.feed(body[start : start + chunk])
    return reader.fields()


PURPOSE = b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch'


def upload(content: bytes) -> bytes:
    head = b'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
    return head + b"Content-Type: application/jsonl\r\n\r\n" + content


def test_fields_and_the_file_come_back_byte_for_byte():
    content = b'{"a": 1}\r\n{"b": "\xc3\xa9"}\n\n--not-a-boundary\r\n'
    fields = parse_form(CONTENT_TYPE, form(PURPOSE, upload(content)))
    assert fields == {"purpose": Part((b"batch",), None), "file": Part((content,), "in.jsonl")}


def test_an_empty_file_is_an_empty_field():
    assert parse_form(CONTENT_TYPE, form(upload(b"")))["file"] == Part((), "in.jsonl")


@pytest.mark.parametrize(
    ("content_type", "body", "message"),
    [
        (b"application/json", b"{}", "must be multipart/form-data"),
        (b"multipart/form-data", form(PURPOSE), "malformed"),
        (CONTENT_TYPE, b"no parts at all", "malformed"),
        (CONTENT_TYPE, form(PURPOSE)[:-10], "ends early"),
        (CONTENT_TYPE, form(b"Content-Disposition: form-data\r\n\r\nx"), "no field name"),
    ],
)
def test_a_body_that_is_not_a_form_is_a_400(content_type, body, message):
    with pytest.raises(GatewayError) as info:
        parse_form(content_type, body)
    assert (info.value.status, info.value.code) == (400, "invalid_request")
    assert message in info.value.message


def test_a_form_fed_a_byte_at_a_time_parses_the_same():
    content = b'{"a": 1}\r\n--' + BOUNDARY[:-1] + b"\r\n"
    body = form(PURPOSE, upload(content))
    assert parse_form(CONTENT_TYPE, body, chunk=1) == parse_form(CONTENT_TYPE, body)


def test_an_upload_costs_about_one_copy_of_its_file_beyond_the_chunk_in_hand():
    """Kept as the store's chunks: no copy when a buffer grows, none to join it (2.1x)."""
    content = b'{"custom_id": "r", "body": {}}\n' * 300_000
    body = form(PURPOSE, upload(content))
    tracemalloc.start()
    try:
        fields = parse_form(CONTENT_TYPE, body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * len(content)
    assert {len(chunk) for chunk in fields["file"].chunks[:-1]} == {CHUNK_BYTES}
    assert fields["file"].content == content


def test_a_form_field_that_is_not_a_file_is_bounded():
    huge = b'Content-Disposition: form-data; name="purpose"\r\n\r\n' + b"x" * 10_000
    with pytest.raises(GatewayError) as info:
        parse_form(CONTENT_TYPE, form(huge))
    assert "exceeds 4096 bytes" in info.value.message


def test_a_malformed_form_is_a_400_that_writes_nothing_to_the_server_log(caplog):
    """The caller reads why in its 400; a log line per bad upload would be the caller's
    to write."""
    reader = FormReader(CONTENT_TYPE)
    with caplog.at_level(logging.DEBUG), pytest.raises(GatewayError) as info:
        reader.feed(b"--another-boundary\r\n")
    assert info.value.status == 400
    assert not caplog.records
