"""Property-based hostile input against the public routes described in docs/openapi.json.

Bodies come from the document's request schemas (so most parse and reach the pipeline),
then some are made hostile: a field replaced by arbitrary JSON, nesting past what can be
sent on, token fields of the wrong type, raw bytes, odd header values. With a healthy
upstream no answer may be a 5xx other than a documented 503/504 refusal, nothing may be
logged with a traceback, and afterwards every pool permit, slot and lease is back at zero.

`SLUICEGATE_HOSTILE_EXAMPLES` sets the cases per route (default 300; the recorded run in
docs/benchmarks.md uses 2,000).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.api.asgi import Router
from sluicegate.api.gateway import Gateway
from sluicegate.core import keys
from sluicegate.core.refusals import Refusal
from tests.support.inprocess import InProcessGateway, inprocess_gateway
from tests.support.processes import Proc, start

OPENAPI = Path(__file__).parents[2] / "docs" / "openapi.json"
EXAMPLES = int(os.environ.get("SLUICEGATE_HOSTILE_EXAMPLES", "300"))
ENV = {"A_KEY": "sk-a", "B_KEY": "sk-b", "ADMIN_KEY": "sk-admin"}
ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "chat",
    "/v1/embeddings": "embed",
}
ROUTE_LABELS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
DOCUMENTED_5XX = {r.value for r in Refusal if r.status in (503, 504)} | {
    "upstream_throttled",
    "upstream_unavailable",
    "upstream_timeout",
}

DOC = json.loads(OPENAPI.read_text())
TALLY: dict[str, Counter[str]] = {path: Counter() for path in ROUTES}


def resolve(node: Any) -> Any:
    """The schema with every local `$ref` replaced by what it names."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None:
            target: Any = DOC
            for part in ref.removeprefix("#/").split("/"):
                target = target[part]
            return resolve(target)
        return {key: resolve(value) for key, value in node.items()}
    if isinstance(node, list):
        return [resolve(item) for item in node]
    return node


def request_schema(path: str) -> dict[str, Any]:
    body = DOC["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return resolve(body["schema"])


def test_the_openapi_document_describes_exactly_the_gateways_routes():
    router = Router()
    Gateway.routes(_Unwired(), router)  # type: ignore[arg-type]
    served = {(method, path) for path, methods in router._routes.items() for method in methods}
    described = {(method.upper(), path) for path, item in DOC["paths"].items() for method in item}
    assert described == served


class _Unwired:
    """Just enough of a Gateway for `routes` to register its handlers."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None

    _inference_handler = staticmethod(lambda endpoint: lambda *args: None)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of the JSON Schema subset docs/openapi.json uses: required properties
    always, optional ones half the time (hypothesis-jsonschema does not run on current
    hypothesis)."""
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(option) for option in schema["anyOf"]])
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in schema["allOf"]:
            merged["properties"].update(part.get("properties", {}))
            merged["required"] += part.get("required", [])
        return from_schema(merged)
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}) for k in kind])
    if kind == "object":
        properties = schema.get("properties")
        if not properties:
            return st.dictionaries(st.text(max_size=8), json_values, max_size=3)
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {name: from_schema(s) for name, s in properties.items() if name in required},
            optional={
                name: from_schema(s) for name, s in properties.items() if name not in required
            },
        )
    if kind == "array":
        items = from_schema(schema.get("items", {}))
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=4)
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=40)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        low, high = schema.get("minimum"), schema.get("maximum")
        return st.floats(low, high, allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return json_values


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def hostile(draw: st.DrawFn, body: dict[str, Any], kind: str) -> bytes:
    """The body as generated, or made hostile in one way."""
    if kind == "field" and body:
        body[draw(st.sampled_from(sorted(body)))] = draw(json_values)
    elif kind == "deep":
        depth = draw(st.sampled_from([130, 255, 256, 300, 1000, 1023, 1025, 5000]))
        body[draw(st.sampled_from(["messages", "prompt", "input", "x"]))] = "<deep>"
        return encode(body).replace(b'"<deep>"', b"[" * depth + b"]" * depth)
    elif kind == "tokens":
        field = draw(st.sampled_from(["max_tokens", "max_completion_tokens", "n", "best_of"]))
        body[field] = draw(st.sampled_from(["16", 1.5, -1, True, "²", [4]]))
    elif kind == "bytes":
        return draw(st.binary(max_size=64))
    return encode(body)


def encode(body: dict[str, Any]) -> bytes:
    """JSON as a client may write it: integers past 64 bits included."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f"),
    max_size=12,
)


def chance(draw: st.DrawFn) -> float:
    """A roughly uniform draw in (0, 1): hypothesis favours the ends of an integer range,
    which would make the rare hostile cases common, so both ends are ordinary values."""
    return draw(st.sampled_from(range(1, 100))) / 100


@st.composite
def headers(draw: st.DrawFn) -> dict[str, str]:
    found = {"content-type": "application/json"}
    found["authorization"] = "Bearer sk-a"
    if chance(draw) < 0.2:
        found["authorization"] = draw(st.sampled_from(["Bearer sk-b", "Bearer sk-x", "x"]))
    if chance(draw) < 0.2:
        lanes = st.sampled_from(["interactive", "batch", "vip"])
        found["x-sluicegate-lane"] = draw(lanes | header_text)
    if chance(draw) < 0.1:
        values = st.sampled_from(["5", "0.5", "nan", "inf", "-1", "1e309", "²", "\u0661"])
        found["x-sluicegate-timeout"] = draw(values | header_text)
    if draw(st.booleans()):
        found["x-stainless-retry-count"] = draw(
            st.sampled_from(["1", "²", "\u0661\u0662", "9" * 30])
        )
    if chance(draw) < 0.05:
        found["content-encoding"] = draw(st.sampled_from(["gzip", "br", "identity"]))
    return found


HOSTILE_KINDS = ["valid"] * 12 + ["field", "deep", "tokens", "bytes"]


@st.composite
def cases(draw: st.DrawFn, path: str) -> tuple[dict[str, str], bytes]:
    """Headers, then a body. Every weighted choice is drawn before the body: draws after
    a large structure come out near their simplest value far more often than uniform."""
    sent = draw(headers())
    kind = HOSTILE_KINDS[int(chance(draw) * len(HOSTILE_KINDS))]
    model = ROUTES[path] if chance(draw) < 0.9 else draw(st.sampled_from(["nope", ""]))
    body = draw(from_schema(request_schema(path)))
    body["model"] = model
    return sent, draw(hostile(body, kind))


class Tracebacks(logging.Handler):
    """Every record logged with an exception, from any thread."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(record)


@pytest.fixture(scope="module")
def fast_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    args = ["--model", "sim-model", "--time-scale", "0"]
    proc = start("sim", args, tmp_path_factory.mktemp("hostile-sim"))
    yield proc
    proc.stop()


def config(sim_url: str) -> dict[str, Any]:
    def deployment(name: str) -> dict[str, Any]:
        return {"name": name, "base_url": f"{sim_url}/v1", "model": "sim-model", "pools": ["sim"]}

    return {
        "server": {"max_body_bytes": 64 * 1024},
        "pools": [{"name": "sim", "max_concurrency": 8}],
        "scheduling": {
            "lanes": [
                {"name": "interactive", "priority": 10, "max_output_tokens": 16},
                {"name": "batch", "priority": 0, "max_output_tokens": 16},
            ]
        },
        "models": [
            {"name": "chat", "deployments": [deployment("sim-chat")]},
            {"name": "embed", "deployments": [deployment("sim-embed")]},
        ],
        "tenants": [
            {"name": "a", "keys": [{"env": "A_KEY"}], "limits": {"max_concurrency": 4}},
            {"name": "b", "keys": [{"env": "B_KEY"}], "lane": "batch"},
        ],
        "admin": {"keys": [{"env": "ADMIN_KEY"}]},
    }


class Running:
    """The gateway on its own event loop in a thread, so hypothesis can drive it with a
    plain blocking client."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self._raw = raw
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready: Future[InProcessGateway] = Future()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        async with inprocess_gateway(self._raw, ENV) as gw:
            self._ready.set_result(gw)
            await self._stop.wait()

    def __enter__(self) -> Running:
        self._thread.start()
        self.gateway = self._ready.result(timeout=20)
        self.port = int(self.gateway.url.rsplit(":", 1)[1])
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)
        self._loop.close()

    def resolved(self, route: str) -> int:
        """Requests of `route` that reached the pipeline and named a model it resolved."""
        future = asyncio.run_coroutine_threadsafe(self._exposition(), self._loop)
        total = 0
        for line in future.result(timeout=10).decode().splitlines():
            counted = line.startswith("sluicegate_requests_total{") and 'model="-"' not in line
            if counted and f'route="{route}"' in line:
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    async def _exposition(self) -> bytes:
        return self.gateway.runtime.metrics.exposition()

    def counters(self) -> dict[str, int]:
        future = asyncio.run_coroutine_threadsafe(self._counters(), self._loop)
        return future.result(timeout=10)

    async def _counters(self) -> dict[str, int]:
        runtime = self.gateway.runtime
        pool = runtime.pools["sim"]
        store = pool.leases.store
        found = {
            "pool active": pool.counters.active,
            "pool slots": await store.in_use(pool.slot.key),
            "leases held": pool.leases.held,
        }
        for tenant in ("a", "b"):
            found[f"tenant {tenant} slots"] = await store.in_use(keys.tenant_slots(tenant))
        for route in ("chat", "completions", "embeddings"):
            found[f"route {route} slots"] = await store.in_use(keys.route_slots(route))
        found["aggregate slots"] = await store.in_use(keys.AGGREGATE_SLOTS)
        for name, dispatcher in runtime.dispatchers.items():
            found[f"{name} queued"] = sum(lane.queued for lane in dispatcher.view().lanes)
            for target in dispatcher.targets:
                found[f"breaker {target.deployment.name}"] = target.breaker.in_flight
        return found


@pytest.fixture(scope="module")
def running(fast_sim: Proc) -> Iterator[tuple[Running, Tracebacks]]:
    handler = Tracebacks()
    # uvicorn's own loggers do not propagate to the root.
    watched = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error")]
    for logger in watched:
        logger.addHandler(handler)
    try:
        with Running(config(fast_sim.url)) as gw:
            yield gw, handler
    finally:
        for logger in watched:
            logger.removeHandler(handler)


def send(port: int, path: str, body: bytes, sent: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        encoded = {name: value.encode() for name, value in sent.items()}
        connection.request("POST", path, body, encoded)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def code_of(payload: bytes) -> str:
    try:
        return str(orjson.loads(payload)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ""


@pytest.mark.parametrize("path", list(ROUTES))
def test_hostile_input_never_forces_a_5xx_or_leaks_capacity(running, path):
    gw, logged = running
    tally = TALLY[path]
    before = gw.resolved(ROUTE_LABELS[path])

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cases(path))
    def case(drawn: tuple[dict[str, str], bytes]) -> None:
        sent, body = drawn
        status, payload = send(gw.port, path, body, sent)
        code = "" if status == 200 else code_of(payload)
        tally[f"{status} {code}".strip()] += 1
        tally["cases"] += 1
        assert status < 500 or code in DOCUMENTED_5XX, (status, payload[:300], body[:300])

    case()
    tally["reached the pipeline"] = gw.resolved(ROUTE_LABELS[path]) - before
    print(f"\n{path}: {dict(tally.most_common())}")
    found: dict[str, int] = {}
    for _ in range(50):
        found = gw.counters()
        if not any(found.values()):
            break
        threading.Event().wait(0.1)
    assert not any(found.values()), found
    assert not logged.records, [record.getMessage() for record in logged.records[:5]]
    # Most draws must get past the edge's checks, or the suite tests only those. The
    # share that does varies with hypothesis's draws: 99-153 of 300 in four runs of
    # /v1/completions (2026-12-03), so a third failed one run in four; below a fifth
    # would be a change in the gateway or the strategies, not the draw.
    assert tally["reached the pipeline"] >= tally["cases"] // 5
