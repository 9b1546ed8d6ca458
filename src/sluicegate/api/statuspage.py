"""The live status page: a login form, the page, and its feed of status documents.

The page is static (HTML, a script, a stylesheet shipped in the package); everything it
shows arrives from `/admin/live`, one server-sent event a second carrying the document
`/admin/status` answers with, built by the same function, so the page, the status route
and `/metrics` read the same views. A viewer costs a document a second (with workers, a
question to each sibling), so their number is capped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

import orjson

from sluicegate.api.asgi import (
    ClientDisconnected,
    DisconnectWatcher,
    Headers,
    Receive,
    Router,
    Scope,
    Send,
    header,
    read_body_within,
    send_bytes,
    send_error,
)
from sluicegate.api.auth import key_digest, unauthorised
from sluicegate.api.login import Logins
from sluicegate.core.clock import Clock, sleep_until
from sluicegate.core.errors import ErrorType, GatewayError
from sluicegate.providers.sse import frame

COOKIE = b"sluicegate_login"
MAX_FORM_BYTES = 4096
"""A login form holds one key; a larger body is refused (413) unread."""

FORM_TIMEOUT_S = 10.0
TICK_S = 1.0
"""How often the feed sends a document."""

FORM = b"application/x-www-form-urlencoded"
FAILED = b"<!--failed-->"
"""Where the login form says that the last key was wrong."""

_ASSETS = {
    "/status/app.js": ("app.js", b"text/javascript; charset=utf-8"),
    "/status/style.css": ("style.css", b"text/css; charset=utf-8"),
}
_HTML = b"text/html; charset=utf-8"
_SAFE: Headers = [
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"referrer-policy", b"no-referrer"),
]
_LIVE: Headers = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _asset(name: str) -> bytes:
    return (resources.files("sluicegate") / "status" / name).read_bytes()


class StatusPage:
    """`/status`, its assets, `/admin/login`, `/admin/logout` and `/admin/live`."""

    def __init__(
        self,
        status: Callable[[], Awaitable[dict[str, Any]]],
        admin_keys: frozenset[bytes],
        logins: Logins,
        clock: Clock,
        viewers: int,
        serving: Callable[[], bool],
    ) -> None:
        self._status = status
        self._admin_keys = admin_keys
        self._logins = logins
        self._clock = clock
        self._cap = viewers
        self._serving = serving
        self.viewers = 0
        self._page = _asset("page.html")
        self._form = _asset("login.html")
        self._assets = {path: (_asset(name), kind) for path, (name, kind) in _ASSETS.items()}

    def routes(self, router: Router) -> Router:
        router.add("GET", "/status", self._show)
        for path in self._assets:
            router.add("GET", path, self._send_asset)
        router.add("POST", "/admin/login", self._login)
        router.add("POST", "/admin/logout", self._logout)
        router.add("GET", "/admin/live", self._live)
        return router

    async def _show(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The page to a logged-in browser, else the login form."""
        page = self._page if self._login_expiry(scope) is not None else self._form
        await send_bytes(send, 200, page, [(b"content-type", _HTML), *_SAFE])

    async def _send_asset(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, kind = self._assets[scope["path"]]
        await send_bytes(send, 200, body, [(b"content-type", kind), *_SAFE])

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The key from the form's body (never a URL) for a token in an HttpOnly,
        SameSite=Strict cookie; a wrong key gets the form again, with a 401."""
        try:
            key = await _form_key(scope, receive)
        except GatewayError as err:
            await send_error(send, err, close=True)
            return
        except ClientDisconnected:
            return
        token = None if key is None else self._logins.issue(key)
        if token is None:
            page = self._form.replace(FAILED, b'<p class="failed">That is not an admin key.</p>')
            await send_bytes(send, 401, page, [(b"content-type", _HTML), *_SAFE])
            return
        cookie = _cookie(token, self._logins.ttl_s)
        await send_bytes(send, 303, b"", [(b"location", b"/status"), cookie, *_SAFE])

    async def _logout(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The cookie cleared: the token itself stays valid until it lapses, as nothing
        records it."""
        try:
            await read_body_within(scope, receive, MAX_FORM_BYTES, FORM_TIMEOUT_S)
        except GatewayError as err:
            await send_error(send, err, close=True)
            return
        except ClientDisconnected:
            return
        cookie = _cookie(b"", 0)
        await send_bytes(send, 303, b"", [(b"location", b"/status"), cookie, *_SAFE])

    async def _live(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A status document a second, for a login cookie or an admin bearer key, until
        the caller leaves, the login lapses or the gateway stops."""
        until = self._login_expiry(scope)
        if until is None and key_digest(scope) not in self._admin_keys:
            await send_error(send, unauthorised("log in at /status, or send an admin key"))
            return
        if self.viewers >= self._cap:
            await send_error(send, _too_many_viewers(self._cap))
            return
        self.viewers += 1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _LIVE})
            async with DisconnectWatcher(receive):
                await self._follow(send, until)
            await send({"type": "http.response.body", "body": b""})
        except ClientDisconnected:
            pass
        finally:
            self.viewers -= 1

    async def _follow(self, send: Send, until: int | None) -> None:
        clock = self._clock
        due = clock.now()
        while self._serving() and (until is None or self._logins.current(until)):
            document = orjson.dumps({"status": await self._status()})
            await send({"type": "http.response.body", "body": frame(document), "more_body": True})
            due = max(due + TICK_S, clock.now())
            await sleep_until(clock, due)

    def _login_expiry(self, scope: Scope) -> int | None:
        token = _cookie_value(header(scope, b"cookie"))
        return None if token is None else self._logins.expiry(token)


async def _form_key(scope: Scope, receive: Receive) -> bytes | None:
    """The `key` field of a urlencoded form body; None when there is none."""
    kind = header(scope, b"content-type") or b""
    if kind.split(b";", 1)[0].strip().lower() != FORM:
        raise GatewayError(
            415,
            "unsupported_media_type",
            "send the login form as application/x-www-form-urlencoded",
            ErrorType.INVALID_REQUEST,
            should_retry=False,
        )
    body = await read_body_within(scope, receive, MAX_FORM_BYTES, FORM_TIMEOUT_S)
    fields = parse_qs(body.decode("latin-1"), max_num_fields=4, encoding="latin-1")
    values = fields.get("key")
    return values[0].strip().encode("latin-1") if values else None


def _cookie(token: bytes, max_age_s: int) -> tuple[bytes, bytes]:
    return (
        b"set-cookie",
        COOKIE + b"=" + token + b"; HttpOnly; SameSite=Strict; Path=/; Max-Age=%d" % max_age_s,
    )


def _cookie_value(value: bytes | None) -> bytes | None:
    """The login cookie's value in a Cookie header, if it has one."""
    if value is None:
        return None
    for part in value.split(b";"):
        name, _, found = part.strip().partition(b"=")
        if name == COOKIE and found:
            return found
    return None


def _too_many_viewers(cap: int) -> GatewayError:
    return GatewayError(
        503,
        "status_viewers_exhausted",
        f"{cap} status pages are following this gateway already (server.status_viewers)",
        ErrorType.UNAVAILABLE,
        retry_after_s=5.0,
    )
