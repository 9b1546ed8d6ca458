"""Which client request ids and trace contexts are taken as they are."""

from __future__ import annotations

import re

import pytest

from sluicegate.core.ids import MAX_REQUEST_ID, accepted_request_id, trace_id, valid_traceparent

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "given", ["abc", "req_01HZX.2:3/4+5=6@x-y", "0" * MAX_REQUEST_ID, "123e4567-e89b-12d3"]
)
def test_a_safe_client_id_is_kept(given: str):
    assert accepted_request_id(given.encode()) == given


@pytest.mark.parametrize(
    "given",
    [b"", b"has space", b"new\nline", b'quote"', b"\xc3\xa9", b"0" * (MAX_REQUEST_ID + 1), None],
)
def test_an_unsafe_or_missing_id_is_replaced_by_a_new_one(given: bytes | None):
    made = accepted_request_id(given)
    assert re.fullmatch(r"[0-9a-f]{24}", made)
    assert made != accepted_request_id(given)


def test_a_valid_traceparent_is_honoured_and_names_its_trace():
    assert valid_traceparent(PARENT.encode()) == PARENT
    assert trace_id(PARENT) == "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    "given",
    [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # trace id all zeros
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # parent id all zeros
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "garbage",
    ],
)
def test_a_malformed_traceparent_is_dropped(given: str):
    assert valid_traceparent(given.encode()) is None
