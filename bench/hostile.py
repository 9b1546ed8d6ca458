"""Hostile requests drawn from a seed, for every route a caller can reach, and the rule
every answer to them must keep.

A draw is an ordinary request made hostile in one way or none: a field replaced by
arbitrary JSON, nesting past what can be sent on, wrong types, control characters, a
body past the size limits, a malformed multipart form, odd headers and paths. Most draws
stay valid enough to get past the edge, or only the edge's checks would be tested. The
fuzz suite (tests/e2e/test_hostile_routes.py) and the soak (bench/soak.py) both send them.

Calls that name an object (`GET /v1/jobs/{id}`, a batch's `input_file_id`) carry a
placeholder filled at sending time with an id the gateway handed out earlier (`Ids`):
the seed fixes every body, but which id a placeholder becomes depends on the order in
which answers came back.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from yarl import URL

from sluicegate.core.refusals import Refusal

CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
KINDS = ("file", "job", "batch")
PLACEHOLDERS = {kind: f"<{kind}>" for kind in KINDS}
DELIBERATE_5XX = {r.value for r in Refusal if r.status >= 500} | {
    "job_backlog_full",
    "job_store_unavailable",
}
"""Codes of the 5xx answers the gateway gives on purpose (it is full, or a store is down)."""


@dataclass(frozen=True, slots=True)
class Keys:
    """The bearer keys the draws use: a tenant allowed every model, a narrower tenant
    (or the same one when there is none), and an admin."""

    tenant: str
    other: str
    admin: str


@dataclass(frozen=True, slots=True)
class Models:
    """Model names: one on an OpenAI deployment, one on an Anthropic deployment, one for
    embeddings."""

    chat: str
    anthropic: str
    embed: str


@dataclass(frozen=True, slots=True)
class Call:
    """One request; `pick` chooses which of the ids already handed out fills a
    placeholder. `oversized` calls send more than a limit allows, so the gateway may
    close the connection before the client has written them."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""
    pick: int = 0
    oversized: bool = False


class Ids:
    """The ids of the files, jobs and batches the gateway handed out, newest kept."""

    def __init__(self, keep: int = 256) -> None:
        self._keep = keep
        self._seen: dict[str, list[str]] = {kind: [] for kind in KINDS}

    def learn(self, status: int, payload: bytes) -> None:
        if status not in (200, 202):
            return
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        kind = document.get("object") if isinstance(document, dict) else None
        if kind in self._seen and isinstance(document.get("id"), str):
            seen = self._seen[kind]
            seen.append(document["id"])
            del seen[: -self._keep]

    def fill(self, call: Call) -> Call:
        """`call` with each placeholder replaced by a known id (or a made-up one)."""
        path, body = call.path, call.body
        for kind, placeholder in PLACEHOLDERS.items():
            seen = self._seen[kind]
            known = seen[call.pick % len(seen)] if seen else f"{kind}_never_issued"
            path = path.replace(placeholder, known)
            body = body.replace(placeholder.encode(), known.encode())
        return replace(call, path=path, body=body)


async def send(
    session: aiohttp.ClientSession, base: str, call: Call, ids: Ids
) -> tuple[int, str, bytes]:
    """Send `call` with its placeholders filled; its status, content type and body. The
    path goes as written: percent-escapes, even invalid ones, are the client's."""
    call = ids.fill(call)
    url = URL(base + call.path, encoded=True)
    data = call.body or None
    async with session.request(call.method, url, data=data, headers=call.headers) as answer:
        payload = await answer.read()
    ids.learn(answer.status, payload)
    return answer.status, answer.headers.get("content-type", ""), payload


def judge(status: int, content_type: str, payload: bytes) -> str | None:
    """What is wrong with an answer, or None. No 5xx but a deliberate refusal; every
    error in OpenAI's shape; every JSON answer parses."""
    if content_type.split(";")[0].strip() == "application/json" or status >= 300:
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return f"{status} with a body that is not JSON: {payload[:200]!r}"
        if status >= 300:
            error = document.get("error") if isinstance(document, dict) else None
            if not (
                isinstance(error, dict)
                and isinstance(error.get("message"), str)
                and isinstance(error.get("type"), str)
                and "code" in error
            ):
                return f"{status} without an OpenAI-shaped error: {payload[:200]!r}"
            if status >= 500 and error["code"] not in DELIBERATE_5XX:
                return f"{status} {error['code']}: {error['message'][:200]}"
    return None


def code_of(payload: bytes) -> str:
    try:
        return str(orjson.loads(payload)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ""


# Values


SCALARS: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    7,
    2**31,
    2**63,
    2**64 + 1,
    -(2**70),
    1.5,
    -0.0,
    1e308,
    1e-308,
    "",
    "0",
    "16",
    "\u00b2",
    "\u0661",
    "null",
)
LETTERS = string.ascii_letters + string.digits + " -_./:@%+"
SPICES = (
    ("\x00\x01\x08\x1b\x7f\x85\x9f", 0.45),
    ("\u00e9\u4e2d\u202e\ufeff\u2028\U0001f600", 0.45),
    ("\ud800\udfff", 0.03),
)
"""Control characters (C0, DEL, C1); characters that render oddly; lone surrogates, which
JSON can escape but no UTF-8 can carry (so rare: each makes a whole body invalid)."""


def text(rng: random.Random, longest: int = 24) -> str:
    """Letters, one string in four seasoned with one kind of odd character."""
    length = rng.randint(0, longest)
    if rng.random() < 0.75:
        return "".join(rng.choice(LETTERS) for _ in range(length))
    spice = rng.choices([chars for chars, _ in SPICES], [weight for _, weight in SPICES])[0]
    return "".join(rng.choice(spice if rng.random() < 0.2 else LETTERS) for _ in range(length))


def clean(rng: random.Random, longest: int = 24) -> str:
    return "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(1, longest)))


def junk(rng: random.Random, depth: int = 0) -> Any:
    """Any JSON value, nested at most four deep."""
    roll = rng.random()
    if depth >= 4 or roll < 0.55:
        return rng.choice(SCALARS) if rng.random() < 0.5 else text(rng)
    if roll < 0.8:
        return [junk(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {text(rng, 8): junk(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def sometimes(rng: random.Random, chance: float, value: Callable[[], Any]) -> Any:
    """`value()` with probability `chance`, else `junk`: a field that is usually right."""
    return value() if rng.random() < chance else junk(rng)


def encode(value: Any) -> bytes:
    """JSON as a client may write it: integers past 64 bits and lone surrogates included."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


# Bodies: made hostile in at most one way


@dataclass(frozen=True, slots=True)
class Body:
    raw: bytes
    oversized: bool = False


def hostile(rng: random.Random, body: dict[str, Any], limit: int) -> Body:
    """`body` as drawn (half the time), or made hostile in one way; `limit` is the
    route's body limit, which an oversized body passes."""
    roll = rng.random()
    if roll < 0.5 or not body:
        return Body(encode(body))
    field = rng.choice(sorted(body))
    if roll < 0.62:
        body[field] = junk(rng)
    elif roll < 0.67:
        del body[field]
    elif roll < 0.71:
        body[text(rng, 12)] = junk(rng)
    elif roll < 0.76:
        depth = rng.choice([64, 200, 254, 255, 256, 300, 1000, 5000])
        body[field] = "<deep>"
        return Body(encode(body).replace(b'"<deep>"', nested(depth).encode()))
    elif roll < 0.80:
        return Body(encode(junk(rng)))
    elif roll < 0.84:
        raw = encode(body)
        return Body(raw[: rng.randint(0, len(raw))])
    elif roll < 0.87:
        return Body(rng.randbytes(rng.randint(0, 64)))
    elif roll < 0.90:
        raw = encode(body)
        return Body(raw[:-1] + b"," + raw[1:])  # every key twice
    elif roll < 0.93:
        return Body(b"\xef\xbb\xbf" + encode(body))
    elif roll < 0.96:
        body[field] = "x" * (limit + rng.randint(1, 4096))
        return Body(encode(body), oversized=True)
    else:
        body[field] = text(rng, 4000)
    return Body(encode(body))


# Headers


def headers(rng: random.Random, keys: Keys, content_type: str | None) -> dict[str, str]:
    found: dict[str, str] = {}
    roll = rng.random()
    if roll < 0.82:
        found["authorization"] = f"Bearer {keys.tenant}"
    elif roll < 0.9:
        found["authorization"] = f"Bearer {keys.other}"
    elif roll < 0.97:
        bad = ["Bearer sk-unknown", "Bearer", "Basic c2s6", "bearer  x", f"Bearer {keys.admin}"]
        found["authorization"] = rng.choice(bad)
    if content_type is not None:
        found["content-type"] = content_type
        if rng.random() < 0.04:
            found["content-type"] = rng.choice(
                ["text/plain", "application/json; charset=latin-1", "multipart/form-data", ""]
            )
    if rng.random() < 0.08:
        found["x-sluicegate-lane"] = rng.choice(["interactive", "batch", "vip", clean(rng, 8)])
    if rng.random() < 0.05:
        found["x-sluicegate-timeout"] = rng.choice(["5", "0.5", "nan", "inf", "-1", "1e309", "²"])
    if rng.random() < 0.03:
        found["content-encoding"] = rng.choice(["gzip", "br", "identity"])
    return found


def segment(rng: random.Random) -> str:
    """A path segment as a client may send it: percent-encoded anything, or no text at all."""
    return rng.choice(
        ["", "..", "%", "%zz", quote(text(rng, 40), safe="", errors="surrogatepass"), "x" * 600]
    )


def query(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return ""
    fields: dict[str, str] = {}
    if rng.random() < 0.7:
        fields["limit"] = rng.choice(["1", "20", "100", "0", "101", "-1", "1e2", "²", ""])
    if rng.random() < 0.4:
        fields["after"] = rng.choice(["<job>", "<file>", "<batch>", text(rng, 30)])
    if rng.random() < 0.1:
        fields[clean(rng, 6)] = "1"
    return "?" + urlencode(fields, encoding="utf-8", errors="surrogatepass")


# Inference bodies


def chat_body(rng: random.Random, model: str) -> dict[str, Any]:
    """A chat request with the structure the Anthropic adapter walks: system and developer
    turns, content parts, tool calls and their results, tools and a tool choice."""
    body: dict[str, Any] = {"model": model, "messages": messages(rng)}
    body["max_tokens"] = sometimes(rng, 0.97, lambda: rng.randint(1, 16))
    options: dict[str, Callable[[], Any]] = {
        "stream": lambda: rng.random() < 0.5,
        "stream_options": lambda: {"include_usage": rng.random() < 0.5},
        "temperature": lambda: rng.choice([0, 0.5, 1.5, 2]),
        "top_p": lambda: rng.random(),
        "stop": lambda: rng.choice(["\n", ["a", "b"], clean(rng, 4)]),
        "user": lambda: clean(rng),
        "tools": lambda: [tool(rng) for _ in range(rng.randint(0, 3))],
        "tool_choice": lambda: rng.choice(
            ["auto", "none", "required", {"type": "function", "function": {"name": "weather"}}]
        ),
        "parallel_tool_calls": lambda: rng.random() < 0.5,
        "n": lambda: rng.choice([1, 2]),
        "logprobs": lambda: rng.random() < 0.5,
        "response_format": lambda: {"type": rng.choice(["text", "json_object"])},
        "priority": lambda: rng.choice([-1000, 0, 1000]),
        "max_completion_tokens": lambda: rng.randint(1, 16),
    }
    for name, value in options.items():
        if rng.random() < 0.1:
            body[name] = sometimes(rng, 0.8, value)
    return body


def messages(rng: random.Random) -> list[Any]:
    drawn = [message(rng) for _ in range(rng.randint(0, 4))]
    if rng.random() < 0.95:
        drawn.append({"role": "user", "content": rng.choice(["hello", "use a tool: weather"])})
    return drawn


def message(rng: random.Random) -> Any:
    role = rng.choice(["system", "developer", "user", "user", "assistant", "tool"])
    if rng.random() < 0.02:
        return junk(rng)
    found: dict[str, Any] = {"role": role if rng.random() < 0.97 else junk(rng)}
    if role == "user":
        found["content"] = sometimes(rng, 0.9, lambda: content(rng))
    elif role == "assistant":
        found["content"] = rng.choice([None, "", "sure", [{"type": "refusal", "refusal": "no"}]])
        if rng.random() < 0.6:
            found["tool_calls"] = sometimes(
                rng, 0.9, lambda: [tool_call(rng) for _ in range(rng.randint(0, 3))]
            )
    elif role == "tool":
        found["tool_call_id"] = sometimes(rng, 0.9, lambda: f"call_{rng.randint(0, 9)}")
        found["content"] = sometimes(rng, 0.9, lambda: content(rng))
    else:
        found["content"] = sometimes(rng, 0.9, lambda: content(rng))
    return found


def content(rng: random.Random) -> Any:
    if rng.random() < 0.5:
        return text(rng, 200)
    return [part(rng) for _ in range(rng.randint(0, 4))]


def part(rng: random.Random) -> Any:
    kind = rng.choice(["text"] * 5 + ["image_url", "image_url", "refusal", "input_audio", None])
    if kind == "text":
        return {"type": "text", "text": sometimes(rng, 0.9, lambda: text(rng, 100))}
    if kind == "image_url":
        url = rng.choice(
            [
                "data:image/png;base64,iVBORw0KGgo=",
                "data:image/png;base64,",
                "data:;base64,AAAA",
                "data:",
                "https://example.invalid/cat.png",
                text(rng, 30),
            ]
        )
        return {"type": "image_url", "image_url": sometimes(rng, 0.9, lambda: {"url": url})}
    if kind == "refusal":
        return {"type": "refusal", "refusal": text(rng, 20)}
    return {"type": kind, kind or "x": junk(rng)}


def tool_call(rng: random.Random) -> Any:
    arguments = rng.choice(
        [
            lambda: '{"city": "Paris"}',
            lambda: "{}",
            lambda: "",
            lambda: "[1, 2]",
            lambda: "not json",
            lambda: "{" + '"a":{' * 300 + "}" * 301,
            lambda: '{"a":' + nested(rng.choice([200, 254, 255, 256, 1000])) + "}",
            lambda: junk(rng),
        ]
    )()
    function = {"name": sometimes(rng, 0.9, lambda: "weather"), "arguments": arguments}
    return {
        "id": sometimes(rng, 0.9, lambda: f"call_{rng.randint(0, 9)}"),
        "type": "function",
        "function": sometimes(rng, 0.95, lambda: function),
    }


def tool(rng: random.Random) -> Any:
    parameters = rng.choice(
        [
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            {"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}}},
            {"type": "object"},
            None,
            "schema",
        ]
    )
    function = {"name": sometimes(rng, 0.9, lambda: "weather"), "parameters": parameters}
    if rng.random() < 0.5:
        function["description"] = text(rng, 40)
    return {"type": sometimes(rng, 0.9, lambda: "function"), "function": function}


def plain_chat(rng: random.Random, model: str) -> dict[str, Any]:
    content = clean(rng, 60)
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4}


def completion_body(rng: random.Random, model: str) -> dict[str, Any]:
    prompt = rng.choice([lambda: text(rng, 200), lambda: [clean(rng), clean(rng)], lambda: ""])()
    return {"model": model, "prompt": prompt, "max_tokens": rng.randint(1, 16)}


def embedding_body(rng: random.Random, model: str) -> dict[str, Any]:
    value = rng.choice([lambda: text(rng, 200), lambda: [clean(rng) for _ in range(3)]])()
    return {"model": model, "input": value}


def inference_body(rng: random.Random, models: Models, path: str) -> dict[str, Any]:
    """An ordinary body for `path`, its model sometimes one it cannot take."""
    if path == CHAT:
        model = models.anthropic if rng.random() < 0.5 else models.chat
        body = chat_body(rng, model)
    elif path == COMPLETIONS:
        body = completion_body(rng, models.chat)
    else:
        body = embedding_body(rng, models.embed)
    if rng.random() < 0.05:
        body["model"] = rng.choice(["nope", "", models.embed if path != EMBEDDINGS else "chat"])
    return body


# Routes


class Draws:
    """Calls for each route, from one seeded generator per route."""

    def __init__(
        self, seed: int, keys: Keys, models: Models, max_body_bytes: int, max_file_bytes: int
    ) -> None:
        self.seed = seed
        self._keys = keys
        self._models = models
        self._max_body = max_body_bytes
        self._max_file = max_file_bytes
        self._routes: dict[str, Callable[[random.Random], Call]] = {
            "chat": self._chat,
            "anthropic": self._anthropic,
            "completions": self._completions,
            "embeddings": self._embeddings,
            "jobs": self._jobs,
            "files": self._files,
            "batches": self._batches,
            "admin": self._admin,
        }

    def calls(self, route: str) -> Iterator[Call]:
        """Calls for `route` (a name of `ROUTES`), for ever, the same for the same seed."""
        rng = random.Random(f"{self.seed}:{route}")
        draw = self._routes[route]
        while True:
            yield draw(rng)

    def _json(self, rng: random.Random, method: str, path: str, body: dict[str, Any]) -> Call:
        drawn = hostile(rng, body, self._max_body)
        sent = headers(rng, self._keys, "application/json")
        return Call(method, path, sent, drawn.raw, rng.getrandbits(16), drawn.oversized)

    def _plain(self, rng: random.Random, method: str, path: str) -> Call:
        return Call(method, path, headers(rng, self._keys, None), pick=rng.getrandbits(16))

    def _chat(self, rng: random.Random) -> Call:
        return self._json(rng, "POST", CHAT, inference_body(rng, self._models, CHAT))

    def _anthropic(self, rng: random.Random) -> Call:
        model = self._models.anthropic if rng.random() < 0.95 else self._models.chat
        return self._json(rng, "POST", CHAT, chat_body(rng, model))

    def _completions(self, rng: random.Random) -> Call:
        body = inference_body(rng, self._models, COMPLETIONS)
        return self._json(rng, "POST", COMPLETIONS, body)

    def _embeddings(self, rng: random.Random) -> Call:
        body = inference_body(rng, self._models, EMBEDDINGS)
        return self._json(rng, "POST", EMBEDDINGS, body)

    def _jobs(self, rng: random.Random) -> Call:
        roll = rng.random()
        if roll < 0.6:
            return self._submit(rng)
        if roll < 0.72:
            return self._plain(rng, "GET", "/v1/jobs" + query(rng))
        name = "<job>" if rng.random() < 0.85 else segment(rng)
        method, path = rng.choice(
            [
                ("GET", f"/v1/jobs/{name}"),
                ("GET", f"/v1/jobs/{name}"),
                ("DELETE", f"/v1/jobs/{name}"),
                ("POST", f"/v1/jobs/{name}/cancel"),
                ("POST", f"/v1/jobs/{name}/{segment(rng)}"),
                ("PUT", "/v1/jobs"),
                ("PATCH", f"/v1/jobs/{name}"),
            ]
        )
        return self._plain(rng, method, path)

    def _submit(self, rng: random.Random) -> Call:
        path = rng.choice([CHAT, CHAT, COMPLETIONS, EMBEDDINGS])
        spec: dict[str, Any] = {
            "endpoint": sometimes(rng, 0.95, lambda: path),
            "body": inference_body(rng, self._models, path),
        }
        spec["body"].pop("stream", None)
        fields: dict[str, Callable[[], Any]] = {
            "deadline_s": lambda: rng.choice([0.5, 60, 3600, 0, -1, 1e308, 366 * 86_400]),
            "lane": lambda: rng.choice(["interactive", "batch", "vip"]),
            "priority": lambda: rng.choice([0, 5, -(2**31) + 1, 2**31, 1.5]),
            "idempotency_key": lambda: rng.choice([clean(rng), text(rng, 40), "k" * 257]),
            "version_key": lambda: clean(rng, 4),
            "version": lambda: rng.choice([1, 2, 2**63, -1]),
        }
        for name, value in fields.items():
            if rng.random() < 0.2:
                spec[name] = sometimes(rng, 0.85, value)
        call = self._json(rng, "POST", "/v1/jobs", spec)
        if rng.random() < 0.1:
            key = rng.choice([clean(rng), text(rng, 20).encode("utf-8", "replace").hex()])
            call.headers["idempotency-key"] = key
        return call

    def _files(self, rng: random.Random) -> Call:
        roll = rng.random()
        if roll < 0.65:
            return self._upload(rng, rng.random() < 0.6)
        if roll < 0.75:
            return self._plain(rng, "GET", "/v1/files" + query(rng))
        name = "<file>" if rng.random() < 0.85 else segment(rng)
        method, path = rng.choice(
            [
                ("GET", f"/v1/files/{name}"),
                ("GET", f"/v1/files/{name}/content"),
                ("GET", f"/v1/files/{name}/content"),
                ("DELETE", f"/v1/files/{name}"),
                ("GET", f"/v1/files/{name}/{segment(rng)}"),
                ("PUT", f"/v1/files/{name}"),
            ]
        )
        return self._plain(rng, method, path)

    def upload(self, rng: random.Random) -> Call:
        """An upload of good batch input, but for the odd bad line."""
        return self._upload(rng, True)

    def _upload(self, rng: random.Random, good: bool) -> Call:
        content, oversized = self._input_file(rng, good)
        form = Form(rng)
        if rng.random() < 0.9:
            form.field("purpose", sometimes(rng, 0.9, lambda: "batch"))
        if rng.random() < 0.95:
            filename = rng.choice(["in.jsonl", "in.jsonl", "", text(rng, 40), "a" * 1000])
            form.file("file", filename, content)
        if rng.random() < 0.1:
            form.field(text(rng, 8), junk(rng))
        if rng.random() < 0.03:
            form.field("purpose", "x" * 5000)
        raw, content_type = form.finish()
        sent = headers(rng, self._keys, content_type)
        return Call("POST", "/v1/files", sent, raw, rng.getrandbits(16), oversized)

    def _input_file(self, rng: random.Random, good: bool) -> tuple[bytes, bool]:
        """JSONL batch input of a few requests: plain ones if `good`, else drawn as the
        chat route's are, some lines made hostile, one file in thirty past the size limit."""
        lines = []
        for number in range(rng.randint(1, 6) if good else rng.randint(0, 6)):
            body = plain_chat(rng, self._models.chat) if good else chat_body(rng, self._models.chat)
            body.pop("stream", None)
            line = {"custom_id": f"r{number}", "method": "POST", "url": CHAT, "body": body}
            raw = encode(line) if good or rng.random() < 0.7 else self._bad_line(rng, line)
            lines.append(raw)
        if not good and rng.random() < 0.03:
            lines.append(b"x" * (self._max_file + 1))
            return b"\n".join(lines), True
        return b"\n".join(lines) + rng.choice([b"\n", b"", b"\n\n", b"\r\n"]), False

    def _bad_line(self, rng: random.Random, line: dict[str, Any]) -> bytes:
        return hostile(rng, line, self._max_body).raw.replace(b"\n", b" ")

    def _batches(self, rng: random.Random) -> Call:
        roll = rng.random()
        if roll < 0.65:
            spec: dict[str, Any] = {
                "input_file_id": "<file>" if rng.random() < 0.9 else text(rng, 30),
                "endpoint": sometimes(rng, 0.95, lambda: CHAT),
                "completion_window": sometimes(rng, 0.95, lambda: "24h"),
            }
            if rng.random() < 0.3:
                spec["metadata"] = sometimes(rng, 0.7, lambda: {clean(rng, 8): text(rng, 20)})
            return self._json(rng, "POST", "/v1/batches", spec)
        if roll < 0.75:
            return self._plain(rng, "GET", "/v1/batches" + query(rng))
        name = "<batch>" if rng.random() < 0.85 else segment(rng)
        method, path = rng.choice(
            [
                ("GET", f"/v1/batches/{name}"),
                ("GET", f"/v1/batches/{name}"),
                ("POST", f"/v1/batches/{name}/cancel"),
                ("POST", f"/v1/batches/{name}/{segment(rng)}"),
                ("DELETE", f"/v1/batches/{name}"),
            ]
        )
        return self._plain(rng, method, path)

    def _admin(self, rng: random.Random) -> Call:
        odd = segment(rng)
        path = rng.choice(
            [
                *("/admin/status", "/admin/status", "/metrics", "/v1/models", "/v1/models/chat"),
                *("/ready", "/health", f"/admin/{odd}", f"/v1/models/{odd}"),
            ]
        )
        sent = headers(rng, self._keys, None)
        if path.startswith("/admin") and rng.random() < 0.7:
            sent["authorization"] = f"Bearer {self._keys.admin}"
        return Call(rng.choice(["GET"] * 9 + ["POST"]), path, sent)


ROUTES = ("chat", "anthropic", "completions", "embeddings", "jobs", "files", "batches", "admin")


class Form:
    """A `multipart/form-data` body written by hand, so it can be written wrong."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._boundary = f"sg{rng.getrandbits(48):x}"
        self._parts: list[bytes] = []

    def field(self, name: str, value: Any) -> None:
        shown = value if isinstance(value, str) else json.dumps(value)
        self._part(f'form-data; name="{name}"', shown.encode("utf-8", "surrogatepass"))

    def file(self, name: str, filename: str, content: bytes) -> None:
        disposition = f'form-data; name="{name}"; filename="{filename}"'
        self._part(disposition, content, b"content-type: application/jsonl\r\n")

    def _part(self, disposition: str, content: bytes, extra: bytes = b"") -> None:
        head = f"content-disposition: {disposition}\r\n".encode("utf-8", "surrogatepass")
        self._parts.append(
            b"--%s\r\n%s%s\r\n%s\r\n" % (self._boundary.encode(), head, extra, content)
        )

    def finish(self) -> tuple[bytes, str]:
        """The body and its content type, spoiled one way in ten."""
        rng, boundary = self._rng, self._boundary.encode()
        raw = b"".join(self._parts) + b"--%s--\r\n" % boundary
        content_type = f"multipart/form-data; boundary={self._boundary}"
        roll = rng.random()
        if roll < 0.02:
            raw = raw[: rng.randint(0, len(raw))]
        elif roll < 0.04:
            content_type = "multipart/form-data"
        elif roll < 0.06:
            content_type = "multipart/form-data; boundary=other"
        elif roll < 0.08:
            raw = raw.replace(b"content-disposition: form-data; ", b"content-disposition: ", 1)
        elif roll < 0.1:
            raw = rng.randbytes(rng.randint(0, 200))
        return raw, content_type
