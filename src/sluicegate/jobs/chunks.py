"""Files are kept, in memory as in the store, as a list of chunks of one size.

A list of chunks never needs the copy a growing buffer makes when it grows or is joined,
and the store reads and writes a chunk per statement, so no statement, answer or write
holds more than a chunk of a file, however large the file.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

CHUNK_BYTES = 1024 * 1024


class Chunker:
    """Bytes in pieces of any size in, chunks of `size` out (the last one shorter)."""

    def __init__(self, size: int = CHUNK_BYTES) -> None:
        self._size = size
        self._buffer = bytearray()

    def add(self, data: bytes) -> list[bytes]:
        """The chunks that `data` completed, oldest first."""
        self._buffer += data
        full: list[bytes] = []
        while len(self._buffer) >= self._size:
            full.append(self._take(self._size))
        return full

    def rest(self) -> list[bytes]:
        """The last, shorter chunk, if any bytes are left."""
        return [self._take(len(self._buffer))] if self._buffer else []

    def _take(self, size: int) -> bytes:
        with memoryview(self._buffer) as view:
            chunk = bytes(view[:size])
        del self._buffer[:size]
        return chunk


async def chunked(pieces: AsyncIterable[bytes], size: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
    """`pieces` as chunks of `size`, each as soon as it is complete."""
    chunker = Chunker(size)
    async for piece in pieces:
        for chunk in chunker.add(piece):
            yield chunk
    for chunk in chunker.rest():
        yield chunk
