"""The floor under the gateway's cost: the same edge server with almost no app behind it.

`bench/gateway_instructions.py` runs this in place of `sluicegate serve` when FLOOR is set,
so its instruction count per request is what the stack itself costs, apart from every
rule of the gateway's own:

- `edge`: the gateway's server (uvicorn with its guarded protocol, `api.server`) reads
  the request's body and answers a fixed chat completion; no upstream call.
- `proxy`: as `edge`, but the body is POSTed to the simulator with one pooled aiohttp
  session (the client the gateway uses) and the answer, streamed or not, is relayed as
  it arrives.

usage: floor_app.py edge|proxy PORT   (the simulator's URL in SLUICEGATE_SIM_URL)
"""

from __future__ import annotations

import os
import sys

import aiohttp
import orjson

from sluicegate.api.asgi import Receive, Scope, Send, read_body
from sluicegate.api.server import listen, serve

ANSWER = orjson.dumps(
    {
        "id": "floor",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 16, "total_tokens": 116},
    }
)
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream")]


async def edge(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await read_body(receive, 1 << 22)
    await send({"type": "http.response.start", "status": 200, "headers": JSON})
    await send({"type": "http.response.body", "body": ANSWER})


class Proxy:
    def __init__(self, upstream: str) -> None:
        self._url = upstream + "/v1/chat/completions"
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await edge(scope, receive, send)
            return
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=256), auto_decompress=False
            )
        body = orjson.loads(await read_body(receive, 1 << 22))
        body["model"] = "sim-model"
        async with self._session.post(
            self._url, data=orjson.dumps(body), headers={"content-type": "application/json"}
        ) as response:
            streamed = response.content_type == "text/event-stream"
            headers = SSE if streamed else JSON
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            if not streamed:
                answer = await response.read()
                await send({"type": "http.response.body", "body": answer})
                return
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    app = edge if kind == "edge" else Proxy(os.environ["SLUICEGATE_SIM_URL"])
    serve(app, [listen("127.0.0.1", port)])


if __name__ == "__main__":
    main()
