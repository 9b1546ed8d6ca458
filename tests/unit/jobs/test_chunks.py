"""Pieces of any size in, chunks of one size out."""

from __future__ import annotations

import pytest

from sluicegate.jobs.chunks import Chunker, chunked


@pytest.mark.parametrize("piece", [1, 3, 4, 5, 11, 100])
def test_pieces_of_any_size_come_out_as_chunks_of_one_size(piece):
    data = bytes(range(23))
    chunker = Chunker(4)
    chunks = [c for i in range(0, len(data), piece) for c in chunker.add(data[i : i + piece])]
    chunks += chunker.rest()
    assert [len(c) for c in chunks] == [4, 4, 4, 4, 4, 3]
    assert b"".join(chunks) == data
    assert chunker.rest() == []


async def test_chunked_yields_each_chunk_once_it_is_complete():
    seen: list[bytes] = []

    async def pieces():
        for piece in (b"ab", b"cde", b"f", b""):
            yield piece
            seen.append(piece)

    chunks = []
    async for chunk in chunked(pieces(), 3):
        chunks.append((chunk, len(seen)))
    assert chunks == [(b"abc", 1), (b"def", 2)]
