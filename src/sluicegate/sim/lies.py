"""What a broken or hostile upstream sends in place of an answer, for the faults that lie.

Each lie is built so the gateway cannot tell it from a real answer by its status: a 200
(or a redirect, or a 429) whose headers or body are not what they claim.
"""

from __future__ import annotations

import gzip

from sluicegate.api.asgi import JSON_HEADERS, SSE_HEADERS, Headers, Send, error_headers
from sluicegate.core.errors import GatewayError
from sluicegate.sim.render import completion_body

_HTML = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
_OVERSIZED_BYTES = 1 << 20
_SHORT_BY = 1000
_HUGE_METRICS_BYTES = 8 << 20


class Cut(Exception):
    """The lie is told: cut the connection now (the server's quiet drop)."""


def throttle_headers(err: GatewayError, raw: str | None) -> Headers:
    """An error's headers, with the raw `Retry-After` text in place of the real one."""
    headers = error_headers(err)
    if raw is None or err.status != 429:
        return headers
    kept = [h for h in headers if not h[0].startswith(b"retry-after")]
    return [*kept, (b"retry-after", raw.encode("latin-1", "replace"))]


async def redirect(send: Send, location: str) -> None:
    headers = [(b"location", location.encode("latin-1", "replace")), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 307, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def tell(send: Send, lie: str, stream: bool, model: str) -> None:
    """Answer with the body lie `lie` (one of `faults.BODY_LIES`); raises `Cut` when the
    lie ends by dropping the connection."""
    whole = completion_body("chat", "chatcmpl-lie", 0, model, 1, 8)
    headers: Headers = list(SSE_HEADERS if stream else JSON_HEADERS)
    if lie == "invalid_json":
        body = whole[: len(whole) // 2]
    elif lie == "html":
        body = _HTML
        headers = [(b"content-type", b"text/html")] if stream else list(JSON_HEADERS)
    elif lie == "gzip":
        body = gzip.compress(b" " * (16 << 20))
        headers.append((b"content-encoding", b"gzip"))
    elif lie == "oversized":
        body = whole[:-1] + b',"padding":"' + b"x" * _OVERSIZED_BYTES + b'"}'
    else:
        headers.append((b"content-length", str(len(whole) + _SHORT_BY).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": whole, "more_body": True})
        raise Cut
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def metrics_text(lie: str, honest: bytes) -> bytes:
    """The /metrics body for the metrics lie `lie` (one of `faults.METRICS_LIES`)."""
    if lie == "garbage":
        return b'vllm:num_requests_waiting{model_name="x" 1 2 3\n\xff\xfe\x00 }}}\n'
    if lie == "nan":
        return honest.replace(b"vllm:num_requests_waiting{", b"vllm:num_requests_waiting_x{") + (
            b'vllm:num_requests_waiting{model_name="sim"} NaN\n'
        )
    line = b"# " + b"x" * 1000 + b"\n"
    return line * (_HUGE_METRICS_BYTES // len(line))
