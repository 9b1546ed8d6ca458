"""`multipart/form-data` bodies (file uploads), parsed as they arrive by python-multipart.

The body is fed chunk by chunk, so an upload costs its file's size once (the field's
bytes, kept as the store's chunks), not the copies a whole-message parser or a growing
buffer makes. Fields other than files are small by nature and are bounded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import parse_options_header

from sluicegate.core.errors import bad_request
from sluicegate.jobs.chunks import Chunker

logging.getLogger("python_multipart").setLevel(logging.ERROR)
# The parser logs a warning for each malformed body before it raises; the caller reads the
# reason in its 400, and a server log with a line per bad upload is a log callers write.

MAX_FIELD_BYTES = 4096
"""A form field that is not a file (`purpose`) is a word, never a payload."""


@dataclass(frozen=True, slots=True)
class Part:
    """One form field, as chunks of `CHUNK_BYTES` (the last one shorter); `filename` is
    set for file fields."""

    chunks: tuple[bytes, ...]
    filename: str | None

    @property
    def content(self) -> bytes:
        return b"".join(self.chunks)


class FormReader:
    """Feed a form's body with `feed`, then take its fields by name from `fields`."""

    def __init__(self, content_type: bytes) -> None:
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data":
            raise bad_request("the body must be multipart/form-data")
        if not boundary:
            raise bad_request("the multipart/form-data body is malformed: no boundary")
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._begin,
                "on_header_field": self._header_field,
                "on_header_value": self._header_value,
                "on_header_end": self._header_end,
                "on_part_data": self._data,
                "on_part_end": self._end_part,
                "on_end": self._end,
            },
        )
        self._fields: dict[str, Part] = {}
        self._header: tuple[bytearray, bytearray] = (bytearray(), bytearray())
        self._disposition = b""
        self._chunker = Chunker()
        self._chunks: list[bytes] = []
        self._size = 0
        self._ended = False

    def feed(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except MultipartParseError as err:
            raise bad_request(f"the multipart/form-data body is malformed: {err}") from err

    def fields(self) -> dict[str, Part]:
        """The fields once the whole body was fed; a 400 if it ended early."""
        if not self._ended:
            raise bad_request("the multipart/form-data body is malformed: it ends early")
        return self._fields

    def _begin(self) -> None:
        self._disposition = b""
        self._chunks, self._size = [], 0

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header[0].extend(data[start:end])

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._header[1].extend(data[start:end])

    def _header_end(self) -> None:
        name, value = self._header
        if name.lower() == b"content-disposition":
            self._disposition = bytes(value)
        self._header = (bytearray(), bytearray())

    def _data(self, data: bytes, start: int, end: int) -> None:
        self._chunks += self._chunker.add(data[start:end])
        self._size += end - start
        if self._size > MAX_FIELD_BYTES and b"filename" not in self._disposition:
            raise bad_request(f"a form field that is not a file exceeds {MAX_FIELD_BYTES} bytes")

    def _end_part(self) -> None:
        _, options = parse_options_header(self._disposition)
        name = options.get(b"name")
        if not name:
            raise bad_request("a multipart/form-data part has no field name")
        filename = options.get(b"filename")
        decoded = None if filename is None else filename.decode("utf-8", "replace")
        chunks = (*self._chunks, *self._chunker.rest())
        self._fields[name.decode("utf-8", "replace")] = Part(chunks, decoded)
        self._chunks = []

    def _end(self) -> None:
        self._ended = True
