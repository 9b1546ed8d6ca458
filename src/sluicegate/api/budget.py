"""One budget of request-body bytes held at once by the whole process.

Each route bounds its own body (`max_body_bytes`, `max_file_bytes`) and the connection
limit bounds how many arrive together, but their product (4,096 uploads of 16 MiB) is
more memory than a host has. A pure ASGI wrapper counts every body byte as it is
received, holds it until its request ends (a body is kept while its request queues and
runs), and refuses a request whose bytes would pass the budget with a 503: the bytes
already in flight end soon, so another try may pass.
"""

from __future__ import annotations

from sluicegate.api.asgi import Handler, Message, Receive, Scope, Send
from sluicegate.core.refusals import Refusal


class BodyBudget:
    """`app`, with at most `max_bytes` of request bodies in flight at once."""

    def __init__(self, app: Handler, max_bytes: int) -> None:
        self._app = app
        self._max_bytes = max_bytes
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        held = 0

        async def counted() -> Message:
            nonlocal held
            message = await receive()
            size = len(message.get("body", b""))
            if size:
                if self.in_flight + size > self._max_bytes:
                    raise Refusal.BODY_BUDGET.error(
                        f"the gateway holds {self.in_flight} bytes of request bodies; "
                        f"its budget is {self._max_bytes}: try again shortly"
                    )
                self.in_flight += size
                held += size
            return message

        try:
            await self._app(scope, counted, send)
        finally:
            self.in_flight -= held
