"""The global budget of request-body bytes in flight: held from arrival to the end of
the request, refused past the budget with a 503 that closes the connection."""

from __future__ import annotations

import asyncio

import orjson

from sluicegate.api.asgi import Message, Receive, Scope, Send, read_body, send_error, send_json
from sluicegate.api.budget import BodyBudget
from sluicegate.core.errors import GatewayError


class Held:
    """An app that reads the whole body, then keeps the request open until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(receive, 1 << 20)
        except GatewayError as err:
            await send_error(send, err)
            return
        await self.release.wait()
        await send_json(send, 200, {"bytes": len(body)})


async def request(app, *chunks: bytes) -> list[Message]:
    messages = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    await app({"type": "http", "method": "POST", "path": "/", "headers": []}, receive, send)
    return sent


async def test_bodies_in_flight_past_the_budget_are_refused_until_one_ends():
    held = Held()
    budget = BodyBudget(held, 1000)
    first = asyncio.create_task(request(budget, b"a" * 300, b"b" * 300))
    await asyncio.sleep(0)
    assert budget.in_flight == 600
    refused = await asyncio.wait_for(request(budget, b"c" * 300, b"d" * 200), 1)
    assert refused[0]["status"] == 503
    assert orjson.loads(refused[1]["body"])["error"]["code"] == "body_budget_exhausted"
    assert budget.in_flight == 600
    held.release.set()
    assert (await asyncio.wait_for(first, 1))[0]["status"] == 200
    assert budget.in_flight == 0
    passed = await asyncio.wait_for(request(budget, b"e" * 1000), 1)
    assert passed[0]["status"] == 200
    assert budget.in_flight == 0
