"""Tell callers when the gateway decides without its shared limit store.

A pure ASGI wrapper, installed only when a shared store is configured: while the store is
degraded, every response carries `x-sluicegate-degraded: store`, so a client or a load
balancer can see that limits are enforced per replica for now.
"""

from __future__ import annotations

from collections.abc import Callable

from sluicegate.api.asgi import Handler, Message, Receive, Scope, Send

DEGRADED_HEADER = (b"x-sluicegate-degraded", b"store")


def mark_degraded(app: Handler, degraded: Callable[[], bool]) -> Handler:
    """The state is read when the answer starts: a request that found the store gone
    on its way is marked too."""

    async def marked_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start" and degraded():
                headers = [*message.get("headers", ()), DEGRADED_HEADER]
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, marked)

    return marked_app
