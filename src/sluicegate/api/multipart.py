"""`multipart/form-data` bodies (file uploads), parsed by the standard library's MIME parser.

The `email` package is the parser Python itself maintains for MIME; a form upload is a
MIME multipart message once its Content-Type is put in front of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import HTTP

from sluicegate.core.errors import bad_request


@dataclass(frozen=True, slots=True)
class Part:
    """One form field; `filename` is set for file fields."""

    content: bytes
    filename: str | None


def parse_form(content_type: bytes, body: bytes) -> dict[str, Part]:
    """The fields of a form upload by name; a 400 when the body is not one."""
    if not content_type.lower().startswith(b"multipart/form-data"):
        raise bad_request("the body must be multipart/form-data")
    head = b"Content-Type: " + content_type + b"\r\n\r\n"
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if message.defects or not message.is_multipart():
        raise bad_request("the multipart/form-data body is malformed")
    return dict(_field(part) for part in _parts(message))


def _parts(message: EmailMessage) -> list[EmailMessage]:
    return [part for part in message.iter_parts() if isinstance(part, EmailMessage)]


def _field(part: EmailMessage) -> tuple[str, Part]:
    name = part.get_param("name", header="content-disposition")
    if not isinstance(name, str) or not name:
        raise bad_request("a multipart/form-data part has no field name")
    content = part.get_payload(decode=True)
    if not isinstance(content, bytes):
        raise bad_request(f"the form field {name!r} has no content")
    return name, Part(content, part.get_filename())
