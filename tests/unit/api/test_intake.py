"""The job, file and batch routes at the edge: each body is read within the body deadline,
and a tenant holds at most its share of them at once, on a fake clock and a scripted
connection (the server's own is tested in test_server.py)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from sluicegate.api.asgi import CONNECTION, Message, Router
from sluicegate.api.batches import BatchRoutes
from sluicegate.api.intake import Intake, plain, storable
from sluicegate.api.jobs import JobRoutes
from sluicegate.api.ledger import BatchLedger
from sluicegate.core.errors import GatewayError
from tests.config.test_config import ENV, base, parse
from tests.support.clock import FakeClock

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}
BODY_TIMEOUT_S = 5.0
FORM = b"multipart/form-data; boundary=xyz"


class Upload:
    """One request whose body arrives in part, then stalls: the connection a server would
    hand the app, its deadline on the test's clock, and what the app answers."""

    def __init__(self, clock: FakeClock, first: bytes) -> None:
        self._clock = clock
        self._late = False
        self._woken = asyncio.Event()
        self._messages = [{"type": "http.request", "body": first, "more_body": True}]
        self.sent: list[Message] = []
        self.deadlines: list[float] = []

    def read_within(self, timeout_s: float) -> None:
        self.deadlines.append(timeout_s)
        self._clock.call_at(self._clock.now() + timeout_s, self._expire)

    def body_late(self) -> bool:
        return self._late

    def body_complete(self) -> bool:
        return False

    def bound_sends(self, left_s: float | None) -> None: ...

    def abort(self) -> None: ...

    def _expire(self) -> None:
        self._late = True
        self._woken.set()

    async def receive(self) -> Message:
        if self._messages:
            return self._messages.pop(0)
        await self._woken.wait()
        self._woken.clear()
        return {"type": "http.request", "body": b"", "more_body": True}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return self.sent[0]["status"] if self.sent else None

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.sent[0]["headers"])

    @property
    def code(self) -> str:
        return orjson.loads(self.sent[1]["body"])["error"]["code"]


def gateway(clock: FakeClock, **jobs: object) -> Router:
    raw = base()
    raw["server"] = {"body_timeout_s": BODY_TIMEOUT_S}
    raw["tenants"].append({"name": "bob", "keys": [{"env": "BOB_KEY"}]})
    raw["jobs"] = jobs
    intake = Intake(parse(raw, ENV | {"BOB_KEY": KEYS["bob"]}), clock, lambda: None)
    router = JobRoutes(intake).routes(Router())
    return BatchRoutes(intake, BatchLedger(intake)).routes(router)


def start(router: Router, upload: Upload, path: str, tenant: str = "alice") -> asyncio.Task:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [
            (b"authorization", f"Bearer {KEYS[tenant]}".encode()),
            (b"content-type", FORM if path == "/v1/files" else b"application/json"),
        ],
        "extensions": {CONNECTION: upload},
    }
    return asyncio.create_task(router(scope, upload.receive, upload.send))


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("path", "first"),
    [
        ("/v1/jobs", b'{"endpoint": "/v1/chat/co'),
        ("/v1/batches", b'{"input_file_id": "fi'),
        ("/v1/files", b'--xyz\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nba'),
    ],
)
async def test_a_body_still_arriving_at_the_body_deadline_gets_a_408_and_a_close(path, first):
    clock = FakeClock()
    upload = Upload(clock, first)
    task = start(gateway(clock), upload, path)
    await settle()
    assert upload.deadlines == [BODY_TIMEOUT_S]
    clock.advance(BODY_TIMEOUT_S - 0.01)
    await settle()
    assert not task.done()
    clock.advance(0.01)
    await asyncio.wait_for(task, 1)
    assert (upload.status, upload.code) == (408, "body_timeout")
    assert upload.headers[b"connection"] == b"close"


async def test_a_tenant_holds_at_most_its_concurrency_on_these_routes_and_others_pass():
    clock = FakeClock()
    router = gateway(clock, tenant_max_concurrency=2)
    held = [Upload(clock, b"{") for _ in range(2)]
    tasks = [start(router, upload, "/v1/jobs") for upload in held]
    await settle()
    refused = Upload(clock, b"{")
    await asyncio.wait_for(start(router, refused, "/v1/files"), 1)
    assert (refused.status, refused.code) == (429, "tenant_concurrency_limited")
    assert b"retry-after" not in refused.headers
    assert refused.headers[b"connection"] == b"close"
    other = Upload(clock, b"{")
    bobs = start(router, other, "/v1/jobs", tenant="bob")
    await settle()
    assert not bobs.done()
    clock.advance(BODY_TIMEOUT_S)
    await asyncio.wait_for(asyncio.gather(*tasks, bobs), 1)
    assert [upload.status for upload in [*held, other]] == [408] * 3
    again = Upload(clock, b"{")
    last = start(router, again, "/v1/jobs")
    await settle()
    assert again.status is None
    clock.advance(BODY_TIMEOUT_S)
    await asyncio.wait_for(last, 1)
    assert again.status == 408


async def post(
    clock: FakeClock, router: Router, path: str, body: bytes, tenant: str = "alice"
) -> Upload:
    """A request whose whole body arrived with it, answered."""
    upload = Upload(clock, b"")
    upload._messages = [{"type": "http.request", "body": body, "more_body": False}]
    await asyncio.wait_for(start(router, upload, path, tenant), 1)
    return upload


async def test_submissions_past_the_tenants_rate_get_a_429_with_a_real_retry_after():
    clock = FakeClock()
    router = gateway(clock, tenant_submissions_per_minute=2)
    for path in ("/v1/jobs", "/v1/batches"):
        assert (await post(clock, router, path, b"[]")).status == 400
    refused = await post(clock, router, "/v1/files", b"")
    assert (refused.status, refused.code) == (429, "tenant_rate_limited")
    assert refused.headers[b"retry-after"] == b"30"
    assert (await post(clock, router, "/v1/jobs", b"[]", tenant="bob")).status == 400
    clock.advance(29)
    assert (await post(clock, router, "/v1/jobs", b"[]")).status == 429
    assert (await post(clock, router, "/v1/jobs/x/cancel", b"")).status != 429
    clock.advance(1)
    assert (await post(clock, router, "/v1/jobs", b"[]")).status == 400


@pytest.mark.parametrize("char", ["\x00", "\x07", "\t", "\n", "\x1b", "\x7f", "\x85", "\x9f"])
def test_a_control_character_is_never_stored(char: str):
    with pytest.raises(GatewayError) as info:
        plain(f"order{char}7", "idempotency_key")
    assert info.value.status == 400
    assert "'idempotency_key' must not contain control characters" in info.value.message
    assert not storable(f"job{char}")


def test_any_other_text_is_stored_as_it_came():
    for text in ("order-7", "commande n° 7", "注文 7", "🙂", "a b"):
        assert plain(text, "k") == text
        assert storable(text)
