"""The status page's routes: the login form and its cookie, the feed's authentication, its
cap on viewers, and bounds on what a client may send. One fake clock per test drives both
the feed's ticks and the logins' expiry."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import orjson
import pytest

from sluicegate.api.asgi import Message, Router
from sluicegate.api.login import Logins
from sluicegate.api.statuspage import MAX_FORM_BYTES, StatusPage
from tests.support.clock import FakeClock

ADMIN = "sk-admin"
DIGESTS = frozenset({hashlib.sha256(ADMIN.encode()).digest()})


class Page:
    """A StatusPage on a fake clock whose status document counts its builds."""

    def __init__(self, viewers: int = 2, start: float = 10_000.0) -> None:
        self.clock = FakeClock(start=start)
        self.built = 0
        self.serving = True
        self.page = StatusPage(
            self._status,
            DIGESTS,
            Logins(DIGESTS, self.clock, ttl_s=60),
            self.clock,
            viewers,
            lambda: self.serving,
        )
        self.router = self.page.routes(Router())

    async def _status(self) -> dict[str, Any]:
        self.built += 1
        return {"built": self.built}

    async def call(
        self, method: str, path: str, body: bytes = b"", headers: list[tuple[bytes, bytes]] = ()
    ) -> tuple[int, dict[bytes, bytes], bytes]:
        sent: list[Message] = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> Message:
            return messages.pop(0) if messages else await asyncio.Future()

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "headers": list(headers)}
        await self.router(scope, receive, send)
        start = sent[0]
        return (
            start["status"],
            dict(start["headers"]),
            b"".join(m.get("body", b"") for m in sent[1:]),
        )

    async def login(self) -> bytes:
        status, headers, _ = await self.call(
            "POST", "/admin/login", b"key=" + ADMIN.encode(), [FORM]
        )
        assert status == 303
        return headers[b"set-cookie"].split(b";")[0]


FORM = (b"content-type", b"application/x-www-form-urlencoded")


class Viewer:
    """One follower of /admin/live, leaving when told to."""

    def __init__(self, page: Page, headers: list[tuple[bytes, bytes]]) -> None:
        self.messages: list[Message] = []
        self.gone: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

        async def receive() -> Message:
            return await asyncio.shield(self.gone)

        async def send(message: Message) -> None:
            self.messages.append(message)

        scope = {"type": "http", "method": "GET", "path": "/admin/live", "headers": headers}
        self.task = asyncio.ensure_future(page.router(scope, receive, send))

    def leave(self) -> None:
        self.gone.set_result({"type": "http.disconnect"})

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    @property
    def events(self) -> list[bytes]:
        return [m["body"] for m in self.messages[1:] if m.get("body")]


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_without_a_login_the_page_is_the_login_form():
    page = Page()
    status, headers, body = await page.call("GET", "/status")
    assert status == 200
    assert b'action="/admin/login"' in body
    assert b"/status/app.js" not in body
    assert headers[b"content-security-policy"].startswith(b"default-src 'self'")


async def test_the_key_buys_an_http_only_strict_cookie_and_the_page():
    page = Page()
    status, headers, body = await page.call("POST", "/admin/login", b"key=sk-admin", [FORM])
    assert (status, headers[b"location"]) == (303, b"/status")
    cookie = headers[b"set-cookie"]
    assert ADMIN.encode() not in cookie
    assert b"; HttpOnly; SameSite=Strict; Path=/; Max-Age=60" in cookie
    status, _, body = await page.call(
        "GET", "/status", headers=[(b"cookie", cookie.split(b";")[0])]
    )
    assert status == 200
    assert b"/status/app.js" in body
    assert ADMIN.encode() not in body


async def test_a_wrong_key_gets_the_form_again_with_a_401():
    page = Page()
    status, headers, body = await page.call("POST", "/admin/login", b"key=sk-nope", [FORM])
    assert status == 401
    assert b"set-cookie" not in headers
    assert b"That is not an admin key." in body
    assert b"sk-nope" not in body


async def test_the_login_body_is_bounded_and_must_be_a_form():
    page = Page()
    status, _, body = await page.call(
        "POST", "/admin/login", b"key=" + b"k" * MAX_FORM_BYTES, [FORM]
    )
    assert (status, orjson.loads(body)["error"]["code"]) == (413, "body_too_large")
    status, _, _ = await page.call(
        "POST", "/admin/login", b'{"key": "sk-admin"}', [(b"content-type", b"application/json")]
    )
    assert status == 415


@pytest.mark.parametrize("path", ["/admin/login", "/admin/logout"])
async def test_a_caller_who_leaves_while_sending_the_form_gets_no_answer(path):
    page = Page()
    sent: list[Message] = []
    messages = [
        {"type": "http.request", "body": b"key=sk", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [FORM]}
    await page.router(scope, receive, send)
    assert sent == []


async def test_logout_clears_the_cookie():
    page = Page()
    status, headers, _ = await page.call("POST", "/admin/logout")
    assert (status, headers[b"location"]) == (303, b"/status")
    assert headers[b"set-cookie"].startswith(b"sluicegate_login=; HttpOnly; SameSite=Strict")
    assert headers[b"set-cookie"].endswith(b"Max-Age=0")


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"cookie", b"sluicegate_login=1.2.3")],
        [(b"authorization", b"Bearer sk-tenant")],
    ],
)
async def test_the_feed_needs_a_login_or_an_admin_key(headers):
    page = Page()
    status, _, body = await page.call("GET", "/admin/live", headers=headers)
    assert status == 401
    assert orjson.loads(body)["error"]["type"] == "authentication_error"


async def test_the_feed_sends_the_status_document_once_a_second():
    page = Page()
    viewer = Viewer(page, [(b"authorization", b"Bearer sk-admin")])
    await settle()
    assert viewer.status == 200
    assert viewer.events == [b'data: {"status":{"built":1}}\n\n']
    page.clock.advance(0.9)
    await settle()
    assert len(viewer.events) == 1
    page.clock.advance(0.1)
    await settle()
    assert viewer.events[1] == b'data: {"status":{"built":2}}\n\n'
    viewer.leave()
    await viewer.task
    assert page.page.viewers == 0


async def test_viewers_past_the_cap_get_a_503_until_one_leaves():
    page = Page(viewers=2)
    cookie = await page.login()
    first = Viewer(page, [(b"cookie", cookie)])
    second = Viewer(page, [(b"authorization", b"Bearer sk-admin")])
    await settle()
    status, headers, body = await page.call("GET", "/admin/live", headers=[(b"cookie", cookie)])
    error = orjson.loads(body)["error"]
    assert (status, error["code"], headers[b"retry-after"]) == (
        503,
        "status_viewers_exhausted",
        b"5",
    )
    assert error["type"] == "service_unavailable_error"
    first.leave()
    await first.task
    third = Viewer(page, [(b"cookie", cookie)])
    await settle()
    assert third.status == 200
    for viewer in (second, third):
        viewer.leave()
        await viewer.task


async def test_the_feed_ends_when_the_login_lapses():
    page = Page()
    cookie = await page.login()
    viewer = Viewer(page, [(b"cookie", cookie)])
    await settle()
    for _ in range(60):
        page.clock.advance(1.0)
        await settle()
    await asyncio.wait_for(viewer.task, 1)
    assert len(viewer.events) == 60
    assert viewer.messages[-1] == {"type": "http.response.body", "body": b""}
    assert page.page.viewers == 0


async def test_the_feed_ends_when_the_gateway_stops_serving():
    page = Page()
    viewer = Viewer(page, [(b"authorization", b"Bearer sk-admin")])
    await settle()
    page.serving = False
    page.clock.advance(1.0)
    await asyncio.wait_for(viewer.task, 1)
    assert len(viewer.events) == 1
