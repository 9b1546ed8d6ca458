"""One server, two addresses: requests that arrived on the metrics address (`metrics.host`
and `port`) go to its own few routes, the rest to the API. uvicorn serves every socket it
is given with one app, and says in each request's scope which address it came to."""

from __future__ import annotations

from sluicegate.api.asgi import Handler, Receive, Scope, Send


def apart(api: Handler, metrics: Handler, port: int) -> Handler:
    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == port:
            await metrics(scope, receive, send)
        else:
            await api(scope, receive, send)

    return route
