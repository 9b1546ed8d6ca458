"""`GuardedHttp`'s deadlines on a fake loop: its clock, its timers and its tasks are the
test's, and a transport records what the protocol did to it."""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from sluicegate.api.asgi import CONNECTION, Receive, Scope, Send
from sluicegate.api.server import GuardedHttp, server_config
from sluicegate.core.types import EdgeLimits

LIMITS = EdgeLimits(header_timeout_s=10, body_timeout_s=30, write_timeout_s=5)


class Timer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def __lt__(self, other: Timer) -> bool:
        return self.when < other.when

    def cancel(self) -> None:
        self.cancelled = True


class Task:
    def add_done_callback(self, callback: Callable[[Task], None]) -> None:
        pass


class Loop:
    """Time moves only by `advance`; tasks run by `run_tasks`, each until it would wait."""

    def __init__(self) -> None:
        self.now = 0.0
        self.armed: list[Timer] = []
        self.made: list[Timer] = []
        self.ready: list[Coroutine[Any, Any, None]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(when, callback)
        self.made.append(timer)
        heapq.heappush(self.armed, timer)
        return timer

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return self.call_at(self.now + delay, callback)

    def create_task(self, coro: Coroutine[Any, Any, None], **_: object) -> Task:
        self.ready.append(coro)
        return Task()

    def close(self) -> None:
        for coro in self.ready:
            coro.close()

    def run_tasks(self) -> None:
        while self.ready:
            coro = self.ready.pop(0)
            with pytest.raises(StopIteration):
                coro.send(None)

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self.armed and self.armed[0].when <= end:
            timer = heapq.heappop(self.armed)
            if not timer.cancelled:
                self.now = max(self.now, timer.when)
                timer.callback()
        self.now = end


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def write(self, data: bytes) -> None:
        self.written += data
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


EMPTY = [(b"content-length", b"0")]


async def answer_at_once(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the body and answers; bounds its sends by 60 s as the gateway would."""
    connection = scope["extensions"][CONNECTION]
    connection.bound_sends(60)
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": EMPTY})
    await send({"type": "http.response.body", "body": b""})
    connection.bound_sends(None)


@pytest.fixture
def loop() -> Iterator[Loop]:
    loop = Loop()
    yield loop
    loop.close()


def connect(
    loop: Loop, app: Any = answer_at_once, limits: EdgeLimits = LIMITS
) -> tuple[GuardedHttp, Transport]:
    transport = Transport()
    config = server_config(app, limits)
    protocol = config.http(config, ServerState(), {}, _loop=loop)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport


REQUEST = b"POST /v1/x HTTP/1.1\r\nhost: gw\r\ncontent-length: 2\r\n\r\n{}"


def aborted_after(loop: Loop, transport: Transport, seconds: float) -> bool:
    """Whether the connection is aborted `seconds` from now and not a moment before."""
    loop.advance(seconds - 0.1)
    if transport.aborted:
        return False
    loop.advance(0.2)
    return transport.aborted


@pytest.mark.parametrize(("deadline_s", "aborted_s"), [(None, 5), (2, 1)])
def test_a_paused_transport_is_aborted_at_the_write_timeout_or_the_requests_deadline(
    loop, deadline_s, aborted_s
):
    protocol, transport = connect(loop)
    protocol.bound_sends(deadline_s)
    loop.advance(1)
    protocol.pause_writing()
    assert aborted_after(loop, transport, aborted_s)


def test_writing_that_resumes_in_time_is_not_aborted_and_a_new_pause_counts_afresh(loop):
    protocol, transport = connect(loop)
    protocol.pause_writing()
    loop.advance(4)
    protocol.resume_writing()
    loop.advance(3)
    protocol.pause_writing()
    assert aborted_after(loop, transport, 5)


def test_a_deadline_set_while_paused_applies_and_lifting_it_leaves_the_write_timeout(loop):
    protocol, transport = connect(loop)
    protocol.pause_writing()
    protocol.bound_sends(1)
    loop.advance(1.1)
    assert transport.aborted
    protocol, transport = connect(loop)
    protocol.pause_writing()
    protocol.bound_sends(1)
    protocol.bound_sends(None)
    assert aborted_after(loop, transport, 5)


PARTIAL = b"POST /v1/x HTTP/1.1\r\nhost: gw\r\ncontent-length: 2\r\n\r\n{"


def test_a_watched_request_hears_once_that_its_connection_is_lost(loop):
    protocol, _ = connect(loop)
    protocol.data_received(REQUEST)
    lost: list[int] = []
    protocol.watch(lambda: lost.append(1))
    protocol.connection_lost(None)
    protocol.connection_lost(None)
    assert lost == [1]


def test_a_watch_begun_on_a_lost_connection_hears_at_once_and_one_ended_hears_nothing(loop):
    protocol, transport = connect(loop)
    protocol.data_received(REQUEST)
    lost: list[str] = []
    protocol.watch(lambda: lost.append("ended"))
    protocol.watch(None)
    transport.close()
    protocol.watch(lambda: lost.append("late"))
    protocol.connection_lost(None)
    assert lost == ["late"]


def test_uvicorn_rewrites_no_client_address_from_forwarded_headers(loop):
    """Nothing reads it, and the rewrite is a wrapper around every request."""
    assert server_config(answer_at_once, LIMITS).proxy_headers is False


def answering(hold: bool, fail_after_head: bool = False):
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        if hold:
            scope["extensions"][CONNECTION].hold_head()
        await send({"type": "http.response.start", "status": 200, "headers": EMPTY})
        if fail_after_head:
            raise RuntimeError("the app failed after the head")
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.mark.parametrize(("hold", "writes"), [(True, 1), (False, 2)])
def test_a_held_head_leaves_with_the_first_body_bytes_in_one_write(loop, hold, writes):
    protocol, transport = connect(loop, answering(hold))
    protocol.data_received(REQUEST)
    loop.run_tasks()
    assert len(transport.writes) == writes
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert protocol.cycle.transport is transport  # later writes go straight out


def test_a_head_answer_never_holds_its_head(loop):
    protocol, transport = connect(loop, answering(True))
    protocol.data_received(b"HEAD /v1/x HTTP/1.1\r\nhost: gw\r\n\r\n")
    loop.run_tasks()
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_held_head_is_sent_before_the_connection_closes(loop):
    protocol, transport = connect(loop, answering(True, fail_after_head=True))
    protocol.data_received(REQUEST)
    loop.run_tasks()
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.closed


def test_a_body_is_complete_only_once_its_last_byte_is_in(loop):
    protocol, _ = connect(loop)
    protocol.data_received(PARTIAL)
    assert not protocol.body_complete()
    protocol.data_received(b"}")
    assert protocol.body_complete()


def test_a_pipelined_body_still_arriving_is_never_called_complete(loop):
    """The next request's headers came after this one's body, so its own body is whole;
    while the newest one's is still arriving, the answer is "not known" (False)."""
    protocol, _ = connect(loop)
    protocol.data_received(PARTIAL + b"}" + PARTIAL)
    assert not protocol.body_complete()


def test_a_body_incomplete_at_its_deadline_wakes_its_reader_as_late(loop):
    protocol, _ = connect(loop)
    protocol.data_received(PARTIAL)
    protocol.cycle.message_event.clear()  # the reader took the first byte
    protocol.read_within(30)
    loop.advance(29.9)
    assert not protocol.body_late()
    assert not protocol.cycle.message_event.is_set()
    loop.advance(0.2)
    assert protocol.body_late()
    assert protocol.cycle.message_event.is_set()


def test_a_body_complete_in_time_is_never_late(loop):
    protocol, _ = connect(loop)
    protocol.data_received(PARTIAL)
    protocol.read_within(30)
    loop.advance(20)
    protocol.data_received(b"}")
    loop.advance(60)
    assert not protocol.body_late()


def test_a_connection_that_sends_nothing_gets_a_408_at_the_header_deadline(loop):
    _, transport = connect(loop)
    loop.advance(9.9)
    assert not transport.closed
    loop.advance(0.2)
    assert transport.written.startswith(b"HTTP/1.1 408")
    assert b"header_timeout" in transport.written
    assert transport.closed


def test_a_later_requests_headers_are_due_from_its_first_byte(loop):
    protocol, transport = connect(loop)
    protocol.data_received(REQUEST)
    loop.run_tasks()
    loop.advance(4)
    protocol.data_received(REQUEST[:20])
    loop.advance(9.9)
    assert not transport.closed
    loop.advance(0.2)
    assert b'"code":"header_timeout"' in transport.written.rsplit(b"\r\n\r\n", 1)[1]
    assert transport.closed


def test_an_idle_connection_stays_open_for_keep_alive_s_after_its_answer(loop):
    """Longer than clients keep theirs, so a client never reuses one closing under it."""
    protocol, transport = connect(loop)
    protocol.data_received(REQUEST)
    loop.run_tasks()
    assert transport.written.startswith(b"HTTP/1.1 200")
    loop.advance(LIMITS.keep_alive_s - 0.1)
    assert not transport.closed
    loop.advance(0.2)
    assert transport.closed
    assert transport.written.count(b"HTTP/1.1") == 1


def test_requests_that_meet_every_deadline_arm_no_timer_of_their_own(loop):
    """The connection's one timer is re-armed at most once per header deadline passed."""
    protocol, transport = connect(loop)
    for _ in range(1000):
        protocol.data_received(REQUEST)
        loop.run_tasks()
        loop.advance(0.01)
    assert transport.written.count(b"HTTP/1.1 200") == 1000
    assert not transport.closed
    ours = [timer for timer in loop.made if timer.callback != protocol.timeout_keep_alive_handler]
    assert len(ours) <= 2


def head(*headers: bytes, path: bytes = b"/") -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


def test_headers_reach_the_app_as_uvicorns_own_protocol_gives_them(loop):
    raw = head(b"Host: gw", b"X-Mixed-Case: Value", b"Expect: 100-Continue", b"x-empty:")
    ours, _ = connect(loop)
    ours.data_received(raw)
    theirs = HttpToolsProtocol(uvicorn.Config(answer_at_once), ServerState(), {}, _loop=loop)
    theirs.connection_made(Transport())  # type: ignore[arg-type]
    theirs.data_received(raw)
    assert ours.scope["headers"] == theirs.scope["headers"]
    assert ours.expect_100_continue
    assert theirs.expect_100_continue


SMALL = EdgeLimits(max_headers=3, max_header_bytes=40)


@pytest.mark.parametrize(
    ("path", "headers", "refused"),
    [
        (b"/", (b"a: 1", b"b: 2", b"c: 3"), False),  # three headers, 7 bytes with the path
        (b"/", (b"a: 1", b"b: 2", b"c: 3", b"d: 4"), True),
        (b"/", (b"a: " + b"x" * 38,), False),  # path, name and value: 40 bytes
        (b"/", (b"a: " + b"x" * 39,), True),
        (b"/" + b"p" * 37, (b"a: x",), False),
        (b"/" + b"p" * 38, (b"a: x",), True),
    ],
)
def test_the_header_bounds_are_exact(loop, path, headers, refused):
    protocol, transport = connect(loop, limits=SMALL)
    protocol.data_received(head(*headers, path=path))
    assert transport.written.startswith(b"HTTP/1.1 431") is refused
    assert (protocol.cycle is None) is refused


def test_one_endless_header_is_refused_before_it_ends(loop):
    protocol, transport = connect(loop, limits=SMALL)
    protocol.data_received(b"GET / HTTP/1.1\r\nx-big: ")
    for _ in range(20):
        protocol.data_received(b"a" * 10)
    assert transport.written.startswith(b"HTTP/1.1 431")
    assert transport.closed
    head_part, body = transport.written.split(b"\r\n\r\n", 1)
    rid = dict(line.split(b": ", 1) for line in head_part.split(b"\r\n")[1:])[b"x-request-id"]
    assert json.loads(body)["error"]["request_id"] == rid.decode(), "refused before any app"


def test_headers_within_the_bounds_pass_however_finely_they_are_cut(loop):
    protocol, transport = connect(loop, limits=SMALL)
    for byte in head(b"a: " + b"x" * 12, b"b: " + b"x" * 12, b"c: " + b"x" * 11):
        protocol.data_received(bytes([byte]))
    assert not transport.closed
    assert protocol.cycle is not None
