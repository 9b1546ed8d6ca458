"""SSE framing: whole events whatever the line endings and wherever the bytes were cut."""

from __future__ import annotations

import pytest

from sluicegate.providers.sse import (
    MAX_EVENT_BYTES,
    EventSplitter,
    EventTooLarge,
    event_start,
    events,
    frame,
)

STREAMS = {
    "lf": b'data: {"a":1}\n\n: keep-alive\n\ndata: [DONE]\n\n',
    "crlf": b'data: {"a":1}\r\n\r\n: keep-alive\r\n\r\ndata: [DONE]\r\n\r\n',
    "cr": b'data: {"a":1}\r\r: keep-alive\r\rdata: [DONE]\r\r',
    "multi-line": b"event: x\ndata: line one\ndata: line two\nid: 3\n\ndata: [DONE]\n\n",
}
DATA = {
    "lf": [b'{"a":1}', None, b"[DONE]"],
    "crlf": [b'{"a":1}', None, b"[DONE]"],
    "cr": [b'{"a":1}', None, b"[DONE]"],
    "multi-line": [b"line one\nline two", b"[DONE]"],
}


@pytest.mark.parametrize("name", sorted(STREAMS))
@pytest.mark.parametrize("cut", [1, 2, 3, 7, 1000])
def test_events_come_out_whole_and_unchanged_however_the_bytes_are_cut(name, cut):
    stream = STREAMS[name]
    splitter = EventSplitter()
    blocks = [splitter.feed(stream[i : i + cut]) for i in range(0, len(stream), cut)]
    rest = splitter.rest()
    assert rest in (b"", b"data: [DONE]\r\r")  # a final \r is a line end only at the end
    blocks.append(rest)
    assert b"".join(blocks) == stream
    found = [data for block in blocks for _, data in events(block)]
    assert found == DATA[name]


@pytest.mark.parametrize(
    "block", [STREAMS["lf"], STREAMS["multi-line"], b"\ndata: a\n\n\n\ndata: b\nid: 1\n\n"]
)
def test_event_start_finds_where_the_framer_starts_the_event_holding_a_byte(block):
    starts = [0]
    for raw, _ in events(block):
        starts.append(starts[-1] + len(raw))
    for at in range(len(block)):
        line_start = block.rfind(b"\n", 0, at) + 1
        if block[line_start : line_start + 1] != b"\n":
            assert event_start(block, at) == max(s for s in starts if s <= at)


def test_event_start_with_a_cr_anywhere_is_the_block_start():
    assert event_start(STREAMS["crlf"], 30) == 0


def test_a_crlf_split_between_chunks_is_one_line_end():
    splitter = EventSplitter()
    assert splitter.feed(b"data: x\r\n\r") == b""
    assert splitter.feed(b"\ndata: y\r\n\r\n") == b"data: x\r\n\r\ndata: y\r\n\r\n"


def test_an_event_that_never_ends_is_refused_not_buffered_forever():
    splitter = EventSplitter()
    for _ in range(MAX_EVENT_BYTES // 1000):
        splitter.feed(b"x" * 1000)
    with pytest.raises(EventTooLarge):
        splitter.feed(b"x" * 1000)


def test_frame_writes_every_line_as_data():
    assert frame(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert frame(b"one\r\ntwo") == b"data: one\ndata: two\n\n"
    assert [data for _, data in events(frame(b"one\ntwo"))] == [b"one\ntwo"]
